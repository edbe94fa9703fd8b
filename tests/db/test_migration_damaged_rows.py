"""Migration 0023 over a log holding a damaged row: the upgrade and the downgrade finish,
leave that row's bytes as they were, and rewrite the rows around it.

The damage is a form 1 body whose zstd frame header declares 2**56 bytes: zstd tries to
allocate that much before decoding, so a reader that catches only ``ValueError`` dies of
a ``MemoryError`` (the case :mod:`cosigner.db.event_row` already reads as unreadable).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
import zstandard
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import create_async_engine

from cosigner.db import compressed, event_row
from cosigner.db.migrate import upgrade
from cosigner.db.tables import audit_events
from tests.db.test_event_row import _event, _texts, _to
from tests.db.test_migrate import empty_database  # noqa: F401 - fixture

#: A form 1 body whose frame header declares 2**56 content bytes.
PETABYTES = bytes([compressed.V1]) + b"\x28\xb5\x2f\xfd" + b"\xc0" + b"\x00" * 8 + b"\x01"


def test_the_damaged_body_really_asks_for_petabytes() -> None:
    """The premise: the zstd binding raises MemoryError for it; every decoder of ours
    reads it as damage (ValueError), bare frames (forms 4 and 6) included."""
    with pytest.raises(MemoryError):
        zstandard.ZstdDecompressor().decompress(PETABYTES[1:])
    for decode, data in ((compressed.decompress, PETABYTES),
                         (compressed.decompress_bare, PETABYTES[5:])):
        with pytest.raises(ValueError, match="more bytes than can be allocated"):
            decode(data)
    with pytest.raises(event_row.EventUnreadable):
        event_row.text_with(PETABYTES, None, None)


async def test_upgrade_and_downgrade_step_over_a_damaged_row(
        empty_database: str) -> None:  # noqa: F811
    url = empty_database
    engine = create_async_engine(url)
    d = "01a232bb-8747-71dd-9f29-1804dc82d901"
    rows = _texts("t-d", [_event(0, decision_id=d), _event(1, decision_id=d), _event(2),
                          _event(3), _event(4)])
    stored = {seq: compressed.compress(body) for seq, _, body, _ in rows}
    stored[3] = PETABYTES
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0022_s7store_response_row")
            await conn.execute(audit_events.insert(), [
                {"tenant": "t-d", "seq": seq, "type": e.type,
                 "time": datetime(2030, 1, 1, tzinfo=UTC), "decision_id": e.decision_id,
                 "approval_id": e.approval_id, "body": stored[seq], "hash": h}
                for seq, e, _, h in rows])

        async def raw() -> dict[int, bytes]:
            async with engine.connect() as conn:
                got = (await conn.execute(select(audit_events.c.seq,
                                                 text("audit_events.body")))).all()
            return {int(s): bytes(v) for s, v in got}

        await upgrade(url)
        after = await raw()
        assert after[3] == PETABYTES  # left as it was: still unreadable, still reported
        assert {seq: v[0] for seq, v in after.items() if seq != 3} == {
            1: event_row.V4_PAIR, 2: event_row.V5_TAIL, 4: event_row.V6_SINGLE,
            5: event_row.V6_SINGLE}
        async with engine.connect() as conn:
            got = (await conn.execute(select(audit_events.c.seq, audit_events.c.body)
                                      .where(audit_events.c.seq != 3))).all()
        assert {int(s): v.encode() for s, v in got} == {
            seq: body for seq, _, body, _ in rows if seq != 3}

        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0022_s7store_response_row", True)
        down = await raw()
        assert down[3] == PETABYTES
        assert {seq: compressed.decompress(v) for seq, v in down.items() if seq != 3} == {
            seq: body for seq, _, body, _ in rows if seq != 3}
    finally:
        await engine.dispose()
        await asyncio.sleep(0)
