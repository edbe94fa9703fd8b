"""Writing notifications into the outbox, inside the caller's transaction.

The approval use case calls :func:`enqueue` in the same transaction as its approval event,
so a notification exists exactly when the state change committed; the worker
(:mod:`cosigner.webhooks.worker`) delivers it later, and a failing receiver never blocks or
rolls back a decision. Arguments must already be masked (invariant 10).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.core.clock import isoformat
from cosigner.core.ids import new_id
from cosigner.core.settings import Settings, WebhookTarget
from cosigner.db.tables_web import webhook_deliveries

EVENT_TYPES = frozenset({"approval.pending", "approval.decided", "approval.escalated",
                         "approval.break_glass"})


class Backlog:
    """Undelivered deliveries per tenant, as the delivery worker last counted them (every
    poll, from the database, so every replica sees the shared outbox). A tenant at
    ``bound`` opens no approval request (503 ``overloaded``) until deliveries drain."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.pending: dict[str, int] = {}

    def full(self, tenant: str) -> bool:
        return self.pending.get(tenant, 0) >= self.bound

    async def count(self, conn: AsyncConnection) -> None:
        """Refresh :attr:`pending` from the outbox."""
        rows = (await conn.execute(
            select(webhook_deliveries.c.tenant, func.count())
            .where(webhook_deliveries.c.status == "pending")
            .group_by(webhook_deliveries.c.tenant))).all()
        self.pending = {str(tenant): int(n) for tenant, n in rows}


def targets(settings: Settings, tenant: str) -> list[WebhookTarget]:
    """Receivers configured for ``tenant`` (its own plus the ``"*"`` ones)."""
    return [*settings.webhooks.get(tenant, []), *settings.webhooks.get("*", [])]


def detail_url(settings: Settings, approval_id: str) -> str:
    return f"{settings.public_url.rstrip('/')}/ui/approvals/{approval_id}"


async def enqueue(conn: AsyncConnection, settings: Settings, *, tenant: str, event_type: str,
                  approval: dict[str, Any], now: datetime) -> int:
    """Queue one delivery per configured receiver; returns how many.

    ``approval`` holds ``id``, ``tool``, ``args`` (masked), and optionally ``status``,
    ``args_hash``, ``expires_at``, ``decided_by``. The body is frozen here, byte for byte.
    """
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown webhook event type {event_type!r}")
    rows = []
    for target in targets(settings, tenant):
        delivery_id = new_id()
        body = {
            "id": delivery_id,
            "type": event_type,
            "created_at": isoformat(now),
            "tenant": tenant,
            "approval": approval,
            "links": {"detail": detail_url(settings, str(approval["id"]))},
        }
        rows.append({
            "id": delivery_id, "tenant": tenant, "event_type": event_type, "url": target.url,
            "body": json.dumps(body, ensure_ascii=False, sort_keys=True, default=str),
            "status": "pending", "attempts": 0, "next_attempt_at": now,
            "claimed_until": None, "created_at": now, "delivered_at": None,
        })
    if rows:
        await conn.execute(webhook_deliveries.insert(), rows)
    return len(rows)
