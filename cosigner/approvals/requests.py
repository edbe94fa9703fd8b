"""Approval requests as rows: the state machine, loading, expiry and notifications.

States (DESIGN § Wire contracts)::

    pending → approved | rejected | expired | cancelled      (terminal states never change)

:data:`TRANSITIONS` is the whole machine; :func:`transition` refuses anything else and every
change is a conditional ``UPDATE ... WHERE status = <from>``, so on several replicas at most
one writer moves a request. Expiry wins (invariant 5): at ``now >= expires_at`` a request is
expired whatever arrives at that instant; the request is moved to ``expired`` by whoever
notices first (a review, a read, the periodic sweep :func:`expire_due`).

Reviewing and cancelling are :mod:`cosigner.approvals.reviews`; opening is
:mod:`cosigner.approvals.opening`.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.approvals.views import display_args
from cosigner.audit.chain import Event, append
from cosigner.core.errors import (
    ApprovalStateError,
)
from cosigner.core.metrics import metrics
from cosigner.db.tables_approvals import approvals, reviews

if TYPE_CHECKING:
    from cosigner.context import AppContext
    from cosigner.core.settings import Settings
    from cosigner.db.database import Database

__all__ = ["STATES", "SYSTEM_ACTOR", "TERMINAL", "TRANSITIONS", "aware", "event", "expire",
           "expire_due", "expire_if_due", "is_due", "load", "notify", "reviews_of", "transition"]

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


async def expire(conn: AsyncConnection, row: Any, now: datetime,
                  who: dict[str, Any]) -> list[Event]:
    if not await transition(conn, row, "expired", now=now):
        return []
    return [event("approval.expired", row, who, expires_at=aware(row.expires_at).isoformat())]


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


async def expire_due(db: Database, now: datetime, *, limit: int = 500) -> int:
    """Move pending requests with ``expires_at <= now`` to ``expired``; return how many.

    Reads first so an idle sweep takes no write lock. Each expiry is an
    ``approval.expired`` event in its tenant's log, committed with the change.
    """
    async with db.read() as conn:
        due = (await conn.execute(
            select(approvals.c.id, approvals.c.tenant).where(
                approvals.c.status == "pending", approvals.c.expires_at <= now)
            .limit(limit))).all()
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
                events = await expire(conn, row, now, SYSTEM_ACTOR)
                by_tenant.setdefault(row.tenant, []).extend(events)
                count += len(events)
        for tenant in sorted(by_tenant):
            if by_tenant[tenant]:
                await append(conn, tenant, by_tenant[tenant], now=now)
    return count


async def expire_if_due(deps: AppContext, tenant: str, approval_id: str) -> None:
    """Expire one request now if it is due (used by reads that notice it)."""
    now = deps.clock()
    async with deps.db.transaction() as conn:
        row = await load(conn, tenant, approval_id, lock=True)
        if row is not None and is_due(row, now):
            await append(conn, tenant, await expire(conn, row, now, SYSTEM_ACTOR), now=now)
