"""Retention: drop old events only up to a signed checkpoint, which becomes the anchor.

The kept log starts right after the anchor checkpoint, so it (and every later export) still
verifies: the first kept event links to the checkpoint's signed hash. Checkpoints are never
deleted. The prune itself is recorded as an ``audit.pruned`` event in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select

from cosigner.audit.chain import Event, append
from cosigner.audit.checkpoints import row_to_checkpoint
from cosigner.audit.query import utc
from cosigner.core.clock import isoformat
from cosigner.db.database import Database
from cosigner.db.tables import audit_events
from cosigner.db.tables_audit import audit_checkpoints


@dataclass(frozen=True, slots=True)
class PruneResult:
    anchor_seq: int | None
    anchor_hash: str | None
    deleted: int


async def prune(db: Database, *, tenant: str, before: datetime, now: datetime,
                actor: dict[str, Any]) -> PruneResult:
    """Delete ``tenant``'s events with ``seq <=`` the latest checkpoint signed before
    ``before`` (UTC). Without such a checkpoint nothing is deleted (``anchor_seq`` None).

    Raises :class:`~cosigner.core.errors.Unavailable` when storage fails.
    """
    cp = audit_checkpoints.c
    async with db.transaction() as conn:
        row = (await conn.execute(
            select(audit_checkpoints).where(cp.tenant == tenant, cp.time < utc(before))
            .order_by(cp.seq.desc()).limit(1))).first()
        if row is None:
            return PruneResult(None, None, 0)
        anchor = row_to_checkpoint(row)
        result = await conn.execute(delete(audit_events).where(
            audit_events.c.tenant == tenant, audit_events.c.seq <= anchor.seq))
        deleted = int(result.rowcount or 0)
        if deleted:
            await append(conn, tenant, [Event(
                type="audit.pruned", actor=actor,
                payload={"anchor": {"seq": anchor.seq, "hash": anchor.hash,
                                    "time": isoformat(anchor.time), "kid": anchor.kid},
                         "before": isoformat(utc(before)), "deleted": deleted})], now=now)
    return PruneResult(anchor.seq, anchor.hash, deleted)
