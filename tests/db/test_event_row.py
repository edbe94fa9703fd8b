"""Event bodies stored as a difference from the rows before them (issue 20, stored forms
4-6, migration 0023_s8store_event_row): every reader gets exactly the text that was
hashed, on both databases; retention keeps the kept rows readable; the migration
rewrites existing rows up, down and up again."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alembic import command
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select, text, type_coerce
from sqlalchemy.ext.asyncio import create_async_engine

from cosigner.audit.chain import GENESIS, Event, append, verify_bodies
from cosigner.audit.checkpoints import sign_checkpoint
from cosigner.audit.events import stored_bytes
from cosigner.audit.export import ExportRange, export_jsonl
from cosigner.audit.prune import prune
from cosigner.audit.query import EventFilter, query_events
from cosigner.audit.verify import verify_export
from cosigner.core.canonical import hash_bytes
from cosigner.db import compressed, digest, event_row
from cosigner.db.driver_types import RawBlob
from cosigner.db.migrate import alembic_config, upgrade
from cosigner.db.tables import audit_events
from cosigner.db.tables_audit import audit_checkpoints
from tests.audit.conftest import decide, export_lines, jwks
from tests.conftest import Harness
from tests.db.test_migrate import empty_database  # noqa: F401 - fixture

HASHES = st.binary(min_size=32, max_size=32).map(lambda raw: "sha256:" + raw.hex())
#: Hashes the row before may hold, and texts it could never (stored as text: not 32 bytes).
PREVS = HASHES | st.just(GENESIS) | st.text(max_size=80)


@st.composite
def texts(draw: st.DrawFn, prev: str) -> bytes:
    """UTF-8 texts made of pieces that may repeat ``prev``, cut it, or hold the mark and
    separator bytes."""
    pieces = st.text(max_size=30) | st.just(prev) | st.just(prev[:20]) | st.just(
        prev[5:]) | st.sampled_from(["\x1a", "\x1b", '"prev_hash":"', "\x1a\x01"])
    return "".join(draw(st.lists(pieces, max_size=8))).encode()


def read_single(stored: bytes, prev: str | None) -> bytes:
    return event_row.text_with(stored, prev, None).encode()


@settings(max_examples=400, deadline=None)
@given(data=st.data(), prev=PREVS, known=st.booleans())
def test_a_lone_event_reads_back_exactly(data: st.DataObject, prev: str, known: bool) -> None:
    body = data.draw(texts(prev))
    stored = event_row.pack_single(body, prev if known else None)
    leaned = stored[0] == event_row.V6_SINGLE
    assert leaned == (known and b"\x1a" not in body and len(digest.pack(prev)) == 32)
    assert read_single(stored, prev) == body
    if leaned and prev.encode() in body:
        assert prev.encode() not in compressed.decompress_bare(stored[1:])
        with pytest.raises(ValueError):  # the row before is missing
            read_single(stored, None)
    with pytest.raises(ValueError) if leaned else _nothing():
        event_row.text_of(stored)  # a lean form read without the row before it


@settings(max_examples=400, deadline=None)
@given(data=st.data(), first_prev=st.none() | PREVS, second_prev=PREVS)
def test_a_pair_reads_back_exactly(data: st.DataObject, first_prev: str | None,
                                   second_prev: str) -> None:
    first = data.draw(texts(first_prev or GENESIS))
    second = data.draw(texts(second_prev))
    packed = event_row.pack_pair(first, first_prev, second, second_prev)
    usable = not any(byte in part for byte in (b"\x1a", b"\x1b") for part in (first, second))
    usable = usable and len(digest.pack(second_prev)) == 32 and (
        first_prev is None or len(digest.pack(first_prev)) == 32)
    assert (packed is not None) == usable
    if packed is None:
        return
    head, tail = packed
    assert head[0] == event_row.V4_PAIR and tail == event_row.TAIL
    assert read_single(head, first_prev) == first
    assert event_row.text_with(tail, second_prev, head).encode() == second
    with pytest.raises(ValueError):  # a tail whose head is gone
        event_row.text_with(tail, second_prev, None)
    with pytest.raises(ValueError):
        event_row.text_with(tail, None, head)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _event(i: int, **fields: Any) -> Event:
    return Event(type=fields.pop("type", "decision.made"),
                 actor={"subject": "runtime-1", "principal_id": "p-1", "kind": "key"},
                 run_id="run-1", tool="issue_refund", args_hash="sha256:" + "ab" * 32,
                 payload={"n": i, "hash_seen": "sha256:" + "0" * 64}, **fields)


async def _chain(h: Harness, tenant: str, events: list[Event], **kw: Any
                 ) -> list[dict[str, Any]]:
    async with h.db.transaction() as conn:
        return await append(conn, tenant, events, now=datetime(2030, 1, 1, tzinfo=UTC),
                            **kw)


async def _read(h: Harness, tenant: str, *where: Any) -> list[Any]:
    ev = audit_events.c
    async with h.db.read() as conn:
        return list((await conn.execute(
            select(ev.seq, ev.body, ev.hash, type_coerce(ev.body, RawBlob).label("stored"))
            .where(ev.tenant == tenant, *where).order_by(ev.seq))).all())


async def test_every_reader_reads_the_hashed_text(harness: Harness, tenant: str) -> None:
    d1, d2 = "01a23004-efcf-7694-807a-b2d4c931f2a2", "01a23004-efcf-7694-807a-b2d4c931f2a3"
    events = [_event(0, decision_id=d1), _event(1, decision_id=d1, type="permit.minted"),
              _event(2, decision_id=d2), _event(3, approval_id="a-1"),
              _event(4, approval_id="a-1", type="approval.reviewed"), _event(5)]
    stored = await _chain(harness, tenant, events[:1])  # alone at seq 1 (GENESIS)
    stored += await _chain(harness, tenant, events)
    rows = await _read(harness, tenant)
    forms = [bytes(row.stored)[0] for row in rows]
    assert forms == [1, 4, 5, 6, 4, 5, 6]
    assert [row.stored for row in rows][2] == event_row.TAIL
    for row, body in zip(rows, stored, strict=True):
        assert hash_bytes(row.body.encode()) == row.hash == body["hash"]
    assert verify_bodies([(row.body, row.hash) for row in rows]) == (None, None)
    # one row alone: a tail, a single, a head (each with its own subquery)
    for seq in (3, 4, 5):
        (only,) = await _read(harness, tenant, audit_events.c.seq == seq)
        assert only.body == rows[seq - 1].body
    tails = await _read(harness, tenant, audit_events.c.type == "permit.minted")
    assert [r.body for r in tails] == [rows[2].body]
    async with harness.db.read() as conn:
        whole = (await conn.execute(select(audit_events).where(
            audit_events.c.tenant == tenant).order_by(audit_events.c.seq))).all()
        page, _ = await query_events(conn, tenant=tenant,
                                     where=EventFilter(type="permit.minted"))
    assert [r.body for r in whole] == [r.body for r in rows]
    assert page == [{**body, "hash": body["hash"]} for body in stored
                    if body["type"] == "permit.minted"]


@pytest.mark.parametrize("batch", [1, 2, 3])
async def test_an_export_reads_rows_in_order_as_selects_do(harness: Harness, tenant: str,
                                                          batch: int) -> None:
    """The export resolves each batch with the row before it, not a subquery per row;
    batches of 1, 2 and 3 cut pairs at every place."""
    d = "01a23004-efcf-7694-807a-b2d4c931f2a2"
    await _chain(harness, tenant, [_event(0)])
    await _chain(harness, tenant, [_event(1, decision_id=d), _event(2, decision_id=d),
                                   _event(3), _event(4, approval_id="a"),
                                   _event(5, approval_id="a")])
    rows = await _read(harness, tenant)
    for first in (1, 2, 3):  # the anchor's row present (2, 3) or not (1: genesis)
        rng = ExportRange(tenant, None, None, first, len(rows), first - 1,
                          rows[first - 2].hash if first > 1 else GENESIS)
        lines = [line for chunk in [
            c async for c in export_jsonl(harness.db, rng, batch=batch)]
            for line in chunk.split("\n") if line.startswith('{"kind":"event"')]
        # the body is embedded as stored: its exact text
        assert [line.split(',"body":', 1)[1][:-1] for line in lines] == [
            r.body for r in rows[first - 1:]]
        assert [json.loads(line)["hash"] for line in lines] == [r.hash for r in rows[first - 1:]]


async def test_a_first_event_that_keeps_its_prev_hash(harness: Harness, tenant: str) -> None:
    await _chain(harness, tenant, [_event(0), _event(1)])
    stored = await _chain(harness, tenant, [_event(2, decision_id="d"),
                                            _event(3, decision_id="d")], first_alone=True)
    async with harness.db.transaction() as conn:  # the row before goes (as a prune does)
        await conn.execute(audit_events.delete().where(audit_events.c.tenant == tenant,
                                                       audit_events.c.seq <= 2))
    rows = await _read(harness, tenant)
    assert [bytes(r.stored)[0] for r in rows] == [4, 5]
    assert [hash_bytes(r.body.encode()) for r in rows] == [b["hash"] for b in stored]


async def test_a_row_whose_row_before_is_gone_is_refused(harness: Harness,
                                                         tenant: str) -> None:
    await _chain(harness, tenant, [_event(0)])
    await _chain(harness, tenant, [_event(1, decision_id="d"), _event(2, decision_id="d")])
    for gone in (1, 2):  # deleted behind cosigner's back: the head, then the tail fails
        async with harness.db.transaction() as conn:
            await conn.execute(audit_events.delete().where(audit_events.c.tenant == tenant,
                                                           audit_events.c.seq == gone))
        with pytest.raises(ValueError, match="not in the log"):
            await _read(harness, tenant, audit_events.c.seq == gone + 1)
    assert await _read(harness, tenant, audit_events.c.seq == 1) == []


async def test_prune_between_the_two_events_of_a_pair(harness_factory: Any,
                                                      tenant: str) -> None:
    h: Harness = await harness_factory()
    runtime = await h.headers(tenant, "runtime")
    auditor = await h.headers(tenant, "auditor")
    for _ in range(3):
        await decide(h, runtime)
    rows = await _read(h, tenant)
    head = next(r for r in rows if bytes(r.stored)[0] == event_row.V4_PAIR and r.seq > 2)
    at = datetime.now(UTC) - timedelta(days=1)
    checkpoint = sign_checkpoint(h.context.keyring, tenant=tenant, seq=head.seq,
                                 hash_=head.hash, at=at)
    async with h.db.transaction() as conn:  # a checkpoint splitting a pair
        await conn.execute(audit_checkpoints.insert().values(
            tenant=tenant, seq=head.seq, hash=head.hash, time=at, kid=checkpoint.kid,
            token=checkpoint.token))
    result = await prune(h.db, tenant=tenant, before=datetime.now(UTC), now=datetime.now(UTC),
                         actor={"subject": "t", "principal_id": None, "kind": "cli"})
    assert result.anchor_seq == head.seq and result.deleted == head.seq
    kept = await _read(h, tenant)
    assert kept[0].seq == head.seq + 1 and bytes(kept[0].stored)[0] == compressed.V1
    assert [r.body for r in kept[:-1]] == [r.body for r in rows if r.seq > head.seq]
    assert verify_bodies([(r.body, r.hash) for r in kept], start_prev=head.hash,
                         start_seq=head.seq + 1) == (None, None)
    lines = await export_lines(h, auditor)
    report = verify_export(lambda: iter(lines), await jwks(h))
    assert report.ok, report


async def test_the_row_before_is_found_by_the_tenant_seq_key(harness: Harness,
                                                             tenant: str) -> None:
    if harness.db.engine.dialect.name != "sqlite":
        pytest.skip("SQLite's query plan")
    query = select(audit_events.c.body).where(audit_events.c.tenant == tenant,
                                               audit_events.c.type == "x")
    sql = str(query.compile(dialect=harness.db.engine.dialect,
                            compile_kwargs={"literal_binds": True}))
    async with harness.db.read() as conn:
        plan = " | ".join(str(row[-1]) for row in (
            await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)).all())
    assert "SEARCH event_before USING INDEX sqlite_autoindex_audit_events_1 (tenant=? AND " \
           "seq=?)" in plan, plan


def _to(connection: Any, url: str, revision: str, down: bool = False) -> None:
    cfg = alembic_config(url)
    cfg.attributes["connection"] = connection
    (command.downgrade if down else command.upgrade)(cfg, revision)


def _texts(tenant: str, events: list[Event], skip: int | None = None
           ) -> list[tuple[int, Event, bytes, str]]:
    out, prev = [], GENESIS
    for seq, event in enumerate(events, start=1):
        _, text_, digest_ = stored_bytes(event, tenant=tenant, seq=seq,
                                         time=datetime(2030, 1, 1, tzinfo=UTC), prev_hash=prev)
        if seq != skip:
            out.append((seq, event, text_, digest_))
        prev = digest_
    return out


async def test_upgrade_down_and_up_again_with_rows(empty_database: str) -> None:  # noqa: F811
    url = empty_database
    engine = create_async_engine(url)
    d = [f"01a232bb-8747-71dd-9f29-1804dc82d9{i:02x}" for i in range(4)]
    a = _texts("t-a", [_event(0, decision_id=d[0]), _event(1, decision_id=d[0]),
                       _event(2, decision_id=d[1]), _event(3, decision_id=d[2]),
                       _event(4, decision_id=d[2]), _event(5, approval_id="ap"),
                       _event(6, approval_id="ap"), _event(7), _event(8, decision_id="x"),
                       _event(9, decision_id="y")], skip=8)  # a row missing: 9 leans on none
    b = _texts("t-b", [_event(0), _event(1, decision_id=d[3]), _event(2, decision_id=d[3])])
    rows = [("t-a", *r) for r in a] + [("t-b", *r) for r in b]
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0022_s7store_response_row")
            await conn.execute(audit_events.insert(), [
                {"tenant": t, "seq": seq, "type": e.type,
                 "time": datetime(2030, 1, 1, tzinfo=UTC), "decision_id": e.decision_id,
                 "approval_id": e.approval_id, "body": compressed.compress(body),
                 "hash": h} for t, seq, e, body, h in rows])
            if conn.dialect.name == "sqlite":  # one TEXT body, as written before 0017
                await conn.execute(text("UPDATE audit_events SET body = :b WHERE tenant = 't-b'"
                                        " AND seq = 1"), {"b": b[0][2].decode()})

        async def forms() -> dict[tuple[str, int], int]:
            async with engine.connect() as conn:
                got = (await conn.execute(select(audit_events.c.tenant, audit_events.c.seq,
                                                 text("audit_events.body")))).all()
            return {(t, s): bytes(v.encode() if isinstance(v, str) else v)[0]
                    for t, s, v in got}

        async def bodies() -> dict[tuple[str, int], bytes]:
            async with engine.connect() as conn:
                got = (await conn.execute(select(audit_events.c.tenant, audit_events.c.seq,
                                                 audit_events.c.body))).all()
            return {(t, s): v.encode() for t, s, v in got}

        expected = {(t, seq): body for t, seq, _, body, _ in rows}
        before = await forms()
        assert set(before.values()) <= {1, ord("{")} and await bodies() == expected
        await upgrade(url)
        lean = {("t-a", 1): 4, ("t-a", 2): 5, ("t-a", 3): 6, ("t-a", 4): 4, ("t-a", 5): 5,
                ("t-a", 6): 4, ("t-a", 7): 5, ("t-a", 9): 1, ("t-a", 10): 6,
                ("t-b", 1): 6, ("t-b", 2): 4, ("t-b", 3): 5}
        lean[("t-b", 1)] = before[("t-b", 1)]  # alone, with no row before: as it was
        # seq 1's prev_hash is GENESIS, with no row before to hold it: it stays in the frame
        assert await forms() == lean and await bodies() == expected
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0022_s7store_response_row", True)
        assert set((await forms()).values()) <= {1, ord("{")}
        assert await bodies() == expected
        await upgrade(url)
        assert await forms() == lean and await bodies() == expected
        async with engine.connect() as conn:
            count = (await conn.execute(select(func.count()).select_from(audit_events))).scalar()
        assert count == len(rows)
    finally:
        await engine.dispose()
        await asyncio.sleep(0)
