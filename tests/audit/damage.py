"""Damaging a tenant's own audit rows behind Cosigner's back, for the tests of what every
reader of event bodies does with an event that does not read
(:class:`cosigner.db.event_row.EventUnreadable`).

Kinds of damage (:data:`KINDS`), each leaving the event ``seq`` unreadable:

* ``row_before_deleted``: the row ``seq - 1`` deleted by hand (the event's ``prev_hash``,
  or for a pair's tail its whole text, was in it); ``seq`` must be stored in form 4–6;
* ``frame_damaged``: the event's stored frame replaced by bytes that do not decompress
  (its form byte kept);
* ``text_garbled``: the event's stored bytes replaced by a valid frame of a text that is
  not JSON (decodes, but is no event body).

Only the caller's own tenant is touched (the PostgreSQL test database is shared).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select, type_coerce, update

from cosigner.db import compressed, event_row
from cosigner.db.driver_types import RawBlob
from cosigner.db.tables import audit_events
from tests.conftest import Harness

KINDS = ("row_before_deleted", "frame_damaged", "text_garbled")
ev = audit_events.c


async def stored(h: Harness, tenant: str) -> dict[int, bytes]:
    """``{seq: stored body bytes}`` of ``tenant``'s rows."""
    async with h.db.read() as conn:
        rows = (await conn.execute(select(ev.seq, type_coerce(ev.body, RawBlob)).where(
            ev.tenant == tenant).order_by(ev.seq))).all()
    return {int(s): b.encode() if isinstance(b, str) else bytes(b) for s, b in rows}


async def seqs(h: Harness, tenant: str, type_: str, **where: Any) -> list[int]:
    """The ``seq`` of ``tenant``'s events of type ``type_`` (and column values ``where``)."""
    query = select(ev.seq).where(ev.tenant == tenant, ev.type == type_,
                                 *(ev[k] == v for k, v in where.items()))
    async with h.db.read() as conn:
        return [int(s) for s in (await conn.execute(query.order_by(ev.seq))).scalars()]


async def _write(h: Harness, tenant: str, seq: int, body: bytes) -> None:
    async with h.db.transaction() as conn:
        await conn.execute(update(audit_events).where(ev.tenant == tenant, ev.seq == seq)
                           .values(body=body))


async def delete(h: Harness, tenant: str, seq: int) -> None:
    async with h.db.transaction() as conn:
        await conn.execute(audit_events.delete().where(ev.tenant == tenant, ev.seq == seq))


async def damage(h: Harness, tenant: str, seq: int, kind: str) -> set[int]:
    """Damage event ``seq`` of ``tenant`` by ``kind``; the seqs that no longer read or are
    gone (the deleted row; for a damaged head's own bytes, its tail too)."""
    rows = await stored(h, tenant)
    own = rows[seq]
    if kind == "row_before_deleted":  # a head's tail still reads: its row is there
        assert own[0] in (event_row.V4_PAIR, event_row.V5_TAIL, event_row.V6_SINGLE), (
            f"event {seq} is stored in form {own[0]}, which does not lean on its row before")
        await delete(h, tenant, seq - 1)
        return {seq - 1, seq}
    hit = {seq}
    if own[:1] == bytes([event_row.V4_PAIR]) and rows.get(seq + 1) == event_row.TAIL:
        hit.add(seq + 1)  # the tail's text is in this row's frame
    if kind == "frame_damaged":
        lead = own[0] if own[0] in (1, event_row.V4_PAIR, event_row.V6_SINGLE) else 1
        await _write(h, tenant, seq, bytes([lead]) + b"\xff" * 24)
        return hit
    assert kind == "text_garbled", kind
    await _write(h, tenant, seq, compressed.compress(b"{not an event body"))
    return hit


async def edit_actor(h: Harness, tenant: str, seq: int, subject: str) -> None:
    """Rewrite event ``seq``'s body by hand with another actor subject (valid JSON, stored
    in form 1, its ``hash`` column left as it was: it no longer hashes to it)."""
    async with h.db.read() as conn:
        text = (await conn.execute(select(ev.body).where(ev.tenant == tenant,
                                                         ev.seq == seq))).scalar_one()
    body = json.loads(text)
    body["actor"]["subject"] = subject
    edited = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    await _write(h, tenant, seq, compressed.compress(edited))
