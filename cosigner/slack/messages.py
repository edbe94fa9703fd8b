"""Keeping each tenant's Slack channel in step with its approval requests.

The outbox is derived from the approval table, so nothing is lost between a commit and a
post: every round (:meth:`MessageSync.run_once`, a loop of :mod:`cosigner.tasks`)

1. finds the pending requests of Slack-enabled tenants that have no ``slack_messages``
   row, and claims each by inserting its row (``INSERT ... ON CONFLICT DO NOTHING`` on the
   request id: on several replicas exactly one wins) before posting it
   (``chat.postMessage``); the answer's channel and ``ts`` are stored;
2. finds the messages whose request moved on (decided anywhere, cancelled, expired as
   recorded by the expiry sweep, or escalated to another stage) and updates them
   (``chat.update``: the outcome, no buttons), each claimed first with a conditional
   update of ``claimed_until``.

A failed call is retried with exponential backoff (2 s … 15 min, or Slack's
``Retry-After``) up to :data:`MAX_ATTEMPTS`, then the row is ``failed`` (logged). Calls
happen outside any transaction. A process that dies between a post and recording it may
post a request twice after the claim runs out (at least once, never silently dropped).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update

from cosigner.approvals.requests import load, reviews_of
from cosigner.approvals.views import view
from cosigner.core.clock import Clock
from cosigner.core.settings import Settings
from cosigner.db.database import Database, dialect_insert
from cosigner.db.tables_approvals import approvals
from cosigner.db.tables_slack import slack_messages
from cosigner.slack import blocks
from cosigner.slack.api import SlackApi, SlackCallFailed
from cosigner.webhooks.worker import MAX_ATTEMPTS, backoff_s  # the same retry schedule

log = logging.getLogger("cosigner.slack")

#: How long one replica holds a row it is posting or updating (s).
CLAIM_S = 60
BATCH = 20


class MessageSync:
    """Post new requests and update decided ones, for every Slack-enabled tenant.

    :mod:`cosigner.tasks` runs :meth:`run_once` every ``settings.slack_poll_s``; the
    interactivity route runs it once more right after a Slack click recorded a review.
    """

    def __init__(self, db: Database, settings: Settings, clock: Clock) -> None:
        self._db, self._settings, self._clock = db, settings, clock

    async def run_once(self) -> int:
        """One round; returns how many Web API calls succeeded."""
        tenants = sorted(self._settings.slack)
        if not tenants:
            return 0
        now = self._clock()
        done = 0
        for approval_id, tenant in await self._claim_new(tenants, now):
            done += await self._post(tenant, approval_id)
        for row in await self._claim_changed(tenants, now):
            done += await self._update(row)
        return done

    # --- new requests -------------------------------------------------------------------

    async def _claim_new(self, tenants: list[str], now: datetime) -> list[tuple[str, str]]:
        """Pending requests without a message row, plus rows waiting to (re)post; each
        claimed by this replica."""
        fresh = (select(approvals.c.id, approvals.c.tenant)
                 .outerjoin(slack_messages, slack_messages.c.approval_id == approvals.c.id)
                 .where(approvals.c.tenant.in_(tenants), approvals.c.status == "pending",
                        approvals.c.expires_at > now, slack_messages.c.approval_id.is_(None))
                 .order_by(approvals.c.id).limit(BATCH))  # one lock order on every replica
        retry = (select(slack_messages.c.approval_id, slack_messages.c.tenant)
                 .where(slack_messages.c.tenant.in_(tenants), self._due(now, "posting"))
                 .order_by(slack_messages.c.approval_id).limit(BATCH))
        async with self._db.read() as conn:
            new = (await conn.execute(fresh)).all()
            waiting = (await conn.execute(retry)).all()
        if not new and not waiting:
            return []  # an idle round takes no write lock
        insert = dialect_insert("sqlite" if self._db.is_sqlite else "postgresql")
        claimed: list[tuple[str, str]] = []
        async with self._db.transaction() as conn:
            for approval_id, tenant in new:
                won = await conn.execute(insert(slack_messages).values(
                    approval_id=approval_id, tenant=tenant, state="posting", attempts=0,
                    next_attempt_at=now, claimed_until=now + timedelta(seconds=CLAIM_S),
                    created_at=now, updated_at=now,
                ).on_conflict_do_nothing(index_elements=["approval_id"]))
                if won.rowcount == 1:
                    claimed.append((approval_id, tenant))
            for approval_id, tenant in waiting:
                if await self._claim(conn, approval_id, now, "posting"):
                    claimed.append((approval_id, tenant))
        return claimed

    def _due(self, now: datetime, state: str) -> Any:
        return and_(slack_messages.c.state == state, slack_messages.c.next_attempt_at <= now,
                    or_(slack_messages.c.claimed_until.is_(None),
                        slack_messages.c.claimed_until <= now))

    async def _claim(self, conn: Any, approval_id: str, now: datetime, state: str) -> bool:
        result = await conn.execute(update(slack_messages).where(
            slack_messages.c.approval_id == approval_id, self._due(now, state)).values(
            claimed_until=now + timedelta(seconds=CLAIM_S)))
        return bool(result.rowcount == 1)

    async def _state(self, tenant: str, approval_id: str) -> dict[str, Any] | None:
        now = self._clock()
        async with self._db.read() as conn:
            row = await load(conn, tenant, approval_id, lock=False)
            if row is None:
                return None
            return view(row, await reviews_of(conn, approval_id),
                        public_url=self._settings.public_url, now=now)

    async def _post(self, tenant: str, approval_id: str) -> int:
        api = SlackApi.for_tenant(self._settings, tenant)
        state = await self._state(tenant, approval_id)
        if api is None or state is None or state["status"] != "pending":
            # Decided before it could be posted: nothing left to ask anyone.
            await self._finish(approval_id, state="done", values={
                "shown_status": state["status"] if state else None})
            return 0
        text, content = blocks.message(state, now=self._clock())
        try:
            channel, ts = await api.post_message(self._settings.slack[tenant].channel, text,
                                                 content)
        except SlackCallFailed as exc:
            await self._failed(approval_id, exc)
            return 0
        await self._finish(approval_id, state="open", values={
            "channel": channel, "ts": ts, "shown_status": "pending",
            "shown_stage": state.get("stage", 1)})
        return 1

    # --- requests that moved on ---------------------------------------------------------

    async def _claim_changed(self, tenants: list[str], now: datetime) -> list[Any]:
        # Expiry shows once it is recorded (the sweep, or a read or review that notices):
        # a due stage may escalate instead of expiring.
        moved = or_(approvals.c.status != "pending",
                    approvals.c.stage != slack_messages.c.shown_stage)
        query = (select(slack_messages.c.approval_id, slack_messages.c.tenant,
                        slack_messages.c.channel, slack_messages.c.ts)
                 .join(approvals, approvals.c.id == slack_messages.c.approval_id)
                 .where(slack_messages.c.tenant.in_(tenants), self._due(now, "open"), moved)
                 .order_by(slack_messages.c.approval_id).limit(BATCH))
        async with self._db.read() as conn:
            rows = (await conn.execute(query)).all()
        if not rows:
            return []
        claimed = []
        async with self._db.transaction() as conn:
            for row in rows:
                if await self._claim(conn, row.approval_id, now, "open"):
                    claimed.append(row)
        return claimed

    async def _update(self, row: Any) -> int:
        api = SlackApi.for_tenant(self._settings, row.tenant)
        state = await self._state(row.tenant, row.approval_id)
        if api is None or state is None:
            await self._finish(row.approval_id, state="failed",
                               values={"last_error": "tenant no longer configured"})
            return 0
        text, content = blocks.message(state, now=self._clock())
        try:
            await api.update_message(row.channel, row.ts, text, content)
        except SlackCallFailed as exc:
            await self._failed(row.approval_id, exc)
            return 0
        await self._finish(row.approval_id,
                           state="open" if state["status"] == "pending" else "done",
                           values={"shown_status": state["status"],
                                   "shown_stage": state.get("stage", 1)})
        return 1

    # --- bookkeeping --------------------------------------------------------------------

    async def _finish(self, approval_id: str, *, state: str, values: dict[str, Any]) -> None:
        now = self._clock()
        async with self._db.transaction() as conn:
            await conn.execute(update(slack_messages).where(
                slack_messages.c.approval_id == approval_id).values(
                state=state, attempts=0, claimed_until=None, next_attempt_at=now,
                last_error=None, updated_at=now, **values))

    async def _failed(self, approval_id: str, exc: SlackCallFailed) -> None:
        now = self._clock()
        async with self._db.read() as conn:
            attempts = int((await conn.execute(select(slack_messages.c.attempts).where(
                slack_messages.c.approval_id == approval_id))).scalar_one()) + 1
        values: dict[str, Any] = {"attempts": attempts, "claimed_until": None,
                                  "last_error": exc.error, "updated_at": now}
        if attempts >= MAX_ATTEMPTS:
            values["state"] = "failed"
            log.warning("slack message for approval %s failed for good: %s", approval_id,
                        exc.error)
        else:
            delay = max(exc.retry_after_s or 0.0, backoff_s(attempts))
            values["next_attempt_at"] = now + timedelta(seconds=delay)
            log.info("slack call for approval %s failed (%s); retry in %.0f s", approval_id,
                     exc.error, delay)
        async with self._db.transaction() as conn:
            await conn.execute(update(slack_messages).where(
                slack_messages.c.approval_id == approval_id).values(**values))
