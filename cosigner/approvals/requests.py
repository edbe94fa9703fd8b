"""Approval requests as rows: the state machine, loading, expiry and notifications.

States (DESIGN § Wire contracts)::

    pending → approved | rejected | expired | cancelled      (terminal states never change)

:data:`TRANSITIONS` is the whole machine; :func:`transition` refuses anything else and every
change is a conditional ``UPDATE ... WHERE status = <from>``, so on several replicas at most
one writer moves a request. Expiry wins (invariant 5): at ``now >= expires_at`` a stage is
over whatever arrives at that instant. A requirement with ``on_expired`` then escalates: the
request stays ``pending`` and moves to its next stage (``stage`` + 1, the next stage's
requirement, ``expires_at`` = the old one + the next ``timeout_ms``; a conditional
``UPDATE ... WHERE status = 'pending' AND stage = <from>``, event ``approval.escalated``,
webhook ``approval.escalated`` to the new approvers). Earlier stages' reviews stay on the
request (shown, never counted again). Without a next stage the request is ``expired``.
Whoever notices first moves it (a review, a read, the periodic sweep :func:`expire_due`).

Reviewing and cancelling are :mod:`cosigner.approvals.reviews`; opening is
:mod:`cosigner.approvals.opening`.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, bindparam, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.approvals.views import display_args
from cosigner.audit.chain import Event, append
from cosigner.core.errors import (
    ApprovalStateError,
)
from cosigner.core.metrics import metrics
from cosigner.db.raw_sql import RawStatement
from cosigner.db.tables import permits
from cosigner.db.tables_approvals import approvals, reviews

if TYPE_CHECKING:
    from cosigner.context import AppContext
    from cosigner.core.settings import Settings
    from cosigner.db.database import Database

__all__ = ["STATES", "SYSTEM_ACTOR", "TERMINAL", "TRANSITIONS", "aware", "event", "expire",
           "expire_due", "expire_if_due", "is_due", "load", "notify", "permit_of", "reviews_of",
           "stage_of", "transition"]

log = logging.getLogger("cosigner.approvals")

STATES = ("pending", "approved", "rejected", "expired", "cancelled")
TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"approved", "rejected", "expired", "cancelled"}),
    "approved": frozenset(),
    "rejected": frozenset(),
    "expired": frozenset(),
    "cancelled": frozenset(),
}
TERMINAL = frozenset(state for state, nxt in TRANSITIONS.items() if not nxt)
SYSTEM_ACTOR: dict[str, Any] = {"subject": "system", "principal_id": None, "kind": "system"}


def aware(moment: datetime) -> datetime:
    """SQLite returns naive datetimes; every stored time is UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def is_due(row: Any, now: datetime) -> bool:
    """Expiry wins at the instant itself: ``now >= expires_at``."""
    return bool(row.status == "pending" and now >= aware(row.expires_at))


async def transition(conn: AsyncConnection, row: Any, target: str, *, now: datetime,
                     **values: Any) -> bool:
    """Move ``row`` from its status to ``target`` if the table allows it and nobody else did.

    Returns ``False`` when another writer changed the status first.

    Raises:
        ApprovalStateError: ``target`` is not reachable from the row's status.
    """
    if target not in TRANSITIONS.get(row.status, frozenset()):
        raise ApprovalStateError(f"approval is {row.status}", code="approval_not_pending")
    result = await conn.execute(
        approvals.update()
        .where(approvals.c.id == row.id, approvals.c.status == row.status)
        .values(status=target, decided_at=now, **values))
    if result.rowcount != 1:
        return False
    # Counted when the change is made; a transaction rolled back later still counts once.
    metrics().approval_seconds[(target,)].observe(
        max(0.0, (now - aware(row.created_at)).total_seconds()))
    return True


def event(event_type: str, row: Any, who: dict[str, Any], **payload: Any) -> Event:
    return Event(type=event_type, actor=who, decision_id=row.decision_id, approval_id=row.id,
                 run_id=row.run_id, tool=row.tool, args_hash=row.args_hash,
                 policy=row.policy, payload=payload)


async def load(conn: AsyncConnection, tenant: str, approval_id: str, *,
                lock: bool) -> Any:
    query = select(approvals).where(approvals.c.id == approval_id, approvals.c.tenant == tenant)
    if lock and conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return (await conn.execute(query)).first()


async def reviews_of(conn: AsyncConnection, approval_id: str) -> list[Any]:
    """Reviews of one request, oldest first."""
    return list((await conn.execute(
        select(reviews).where(reviews.c.approval_id == approval_id)
        .order_by(reviews.c.created_at, reviews.c.id))).all())


async def permit_of(conn: AsyncConnection, row: Any) -> Any:
    """The ledger row of the permit minted when ``row`` was approved, or ``None``."""
    if row is None or not getattr(row, "permit_jti", None):
        return None
    return (await conn.execute(select(permits).where(
        permits.c.tenant == row.tenant, permits.c.jti == row.permit_jti))).first()


async def expire(conn: AsyncConnection, row: Any, now: datetime, who: dict[str, Any], *,
                 settings: Settings | None = None) -> list[Event]:
    """End every stage of ``row`` that is over at ``now``: escalate to the next stage, or
    expire the request when there is none. Returns the events (none when another writer
    moved it first). ``settings``: where to queue the escalation webhook (none: no
    webhook)."""
    events: list[Event] = []
    while is_due(row, now):
        nxt = row.requirement.get("on_expired")
        if nxt is None:
            if await transition(conn, row, "expired", now=now):
                events.append(event("approval.expired", row, who, stage=stage_of(row),
                                    expires_at=aware(row.expires_at).isoformat()))
                if settings is not None:  # every terminal transition notifies
                    await notify(conn, settings, row, "approval.decided", now,
                                 status="expired")
            return events
        stage = stage_of(row)
        # The first stage's break-glass and standing settings hold for the whole chain.
        nxt = {**nxt, **{key: row.requirement[key] for key in ("break_glass", "standing")
                         if key in row.requirement}}
        # From the stage's own end, not from when somebody noticed: every replica computes
        # the same instant.
        expires_at = aware(row.expires_at) + timedelta(milliseconds=int(nxt["timeout_ms"]))
        result = await conn.execute(
            approvals.update()
            .where(approvals.c.id == row.id, approvals.c.status == "pending",
                   approvals.c.stage == stage)
            .values(stage=stage + 1, requirement=nxt, expires_at=expires_at))
        if result.rowcount != 1:
            return events
        events.append(event("approval.escalated", row, who, stage=stage + 1,
                            from_stage=stage, require=nxt["require"],
                            distinct_from=nxt["distinct_from"],
                            ended_at=aware(row.expires_at).isoformat(),
                            expires_at=expires_at.isoformat()))
        row = await load(conn, row.tenant, row.id, lock=False)
        if settings is not None:
            await notify(conn, settings, row, "approval.escalated", now)
    return events


def stage_of(row: Any) -> int:
    """The request's current stage (1 for the first; rows built before a write have none)."""
    return int(getattr(row, "stage", None) or 1)


async def notify(conn: AsyncConnection, settings: Settings, row: Any, event_type: str,
                  now: datetime, *, status: str | None = None,
                  decided_by: list[str] | None = None) -> None:
    """Queue a webhook (masked args only) in the same transaction as the state change."""
    from cosigner.webhooks import outbox

    if not outbox.targets(settings, row.tenant):
        return
    approval: dict[str, Any] = {
        "id": row.id, "tool": row.tool, "args": display_args(row.args, row.mask),
        "args_hash": row.args_hash, "status": status or row.status,
        "expires_at": aware(row.expires_at).isoformat()}
    if decided_by is not None:
        approval["decided_by"] = decided_by
    await outbox.enqueue(conn, settings, tenant=row.tenant, event_type=event_type,
                         approval=approval, now=now)


def _due(now: Any) -> tuple[ColumnElement[bool], ...]:
    """Which requests :func:`expire_due` ends: pending, with ``expires_at <= now``."""
    return approvals.c.status == "pending", approvals.c.expires_at <= now


#: Whether :func:`expire_due` has anything to do at ``now`` (a bind value): one indexed
#: read, for the sweep's quiet rounds (:mod:`cosigner.tasks`).
ANY_DUE = RawStatement(select(approvals.c.id).where(*_due(bindparam("now"))).limit(1))


async def expire_due(db: Database, now: datetime, *, settings: Settings | None = None,
                     tenant: str | None = None, limit: int = 500) -> int:
    """End the stages of pending requests with ``expires_at <= now`` (escalate or expire,
    :func:`expire`); return how many stages ended. ``tenant``: only that tenant's.

    Reads first so an idle sweep takes no write lock. Each change is an
    ``approval.expired`` or ``approval.escalated`` event in its tenant's log, committed
    with it.
    """
    query = select(approvals.c.id, approvals.c.tenant).where(*_due(now))
    if tenant is not None:
        query = query.where(approvals.c.tenant == tenant)
    async with db.read() as conn:
        due = (await conn.execute(query.limit(limit))).all()
    if not due:
        return 0
    count = 0
    async with db.transaction() as conn:
        by_tenant: dict[str, list[Event]] = {}
        # Same lock order as every other writer: rows by (tenant, id), then log heads
        # by tenant, so a sweep never forms a lock cycle with a decision batch.
        for item in sorted(due, key=lambda d: (d.tenant, d.id)):
            row = await load(conn, item.tenant, item.id, lock=True)
            if row is not None and is_due(row, now):
                events = await expire(conn, row, now, SYSTEM_ACTOR, settings=settings)
                by_tenant.setdefault(row.tenant, []).extend(events)
                count += len(events)
        for tenant in sorted(by_tenant):
            if by_tenant[tenant]:
                await append(conn, tenant, by_tenant[tenant], now=now)
    return count


async def expire_if_due(deps: AppContext, tenant: str, approval_id: str) -> None:
    """End the request's due stage now (escalate or expire; used by reads that notice)."""
    now = deps.clock()
    async with deps.db.transaction() as conn:
        row = await load(conn, tenant, approval_id, lock=True)
        if row is not None and is_due(row, now):
            await append(conn, tenant, await expire(conn, row, now, SYSTEM_ACTOR,
                                                    settings=deps.settings), now=now)
