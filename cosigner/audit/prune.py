"""Retention: drop old events only up to a signed checkpoint, which becomes the anchor.

The kept log starts right after the anchor checkpoint, so it (and every later export) still
verifies: the first kept event links to the checkpoint's signed hash. Checkpoints are never
deleted. The prune itself is recorded as an ``audit.pruned`` event in the same transaction.

A stored event may need the row before it to be read (its ``prev_hash``, or its text in
that row's frame: :mod:`cosigner.db.event_row`), so the first kept rows are rewritten
whole before the rows before them go, and the ``audit.pruned`` event keeps its own
``prev_hash``. The chain head is locked first, so no event is appended meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, type_coerce, update
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.audit.chain import Event, append, lock_head
from cosigner.audit.checkpoints import row_to_checkpoint
from cosigner.audit.query import utc
from cosigner.core.clock import isoformat
from cosigner.db import compressed, event_row
from cosigner.db.database import Database
from cosigner.db.driver_types import RawBlob
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
        await lock_head(conn, tenant)
        await _stand_alone(conn, tenant, anchor.seq + 1)
        result = await conn.execute(delete(audit_events).where(
            audit_events.c.tenant == tenant, audit_events.c.seq <= anchor.seq))
        deleted = int(result.rowcount or 0)
        if deleted:
            await append(conn, tenant, [Event(
                type="audit.pruned", actor=actor,
                payload={"anchor": {"seq": anchor.seq, "hash": anchor.hash,
                                    "time": isoformat(anchor.time), "kid": anchor.kid},
                         "before": isoformat(utc(before)), "deleted": deleted})], now=now,
                first_alone=True)
    return PruneResult(anchor.seq, anchor.hash, deleted)


async def _stand_alone(conn: AsyncConnection, tenant: str, first: int) -> None:
    """Store the event ``first`` (and the next one when it is the tail of a pair)
    without reference to the rows before it: each its own text, compressed (form 1).

    One that already does not read (the rows before it deleted or damaged outside
    Cosigner) cannot be rewritten: it is left as it is, logged (the prune goes on; an
    export leaves it out and ``cosigner audit verify`` reports it)."""
    ev = audit_events.c
    rows = (await conn.execute(
        select(ev.seq, event_row.lenient(ev.body), type_coerce(ev.body, RawBlob).label("stored"))
        .where(ev.tenant == tenant, ev.seq.in_((first, first + 1))).order_by(ev.seq)
    )).all()
    for row in rows:
        stored = row.stored
        if isinstance(stored, str) or bytes(stored)[:1] not in _LEANING:
            continue
        if int(row.seq) == first + 1 and bytes(stored) != event_row.TAIL:
            continue
        if isinstance(row.body, event_row.Unreadable):
            row.body.error.tenant, row.body.error.seq = tenant, int(row.seq)
            event_row.note_left_out(row.body.error, "the prune's rewrite (kept as stored)")
            continue
        await conn.execute(update(audit_events).where(
            ev.tenant == tenant, ev.seq == row.seq).values(
            body=compressed.compress(row.body.encode())))


#: First bytes of the stored forms that lean on the row before them.
_LEANING = {bytes([event_row.V4_PAIR]), bytes([event_row.V5_TAIL]),
            bytes([event_row.V6_SINGLE])}
