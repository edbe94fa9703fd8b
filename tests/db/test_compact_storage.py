"""Ids as 16 bytes and instants as integers on SQLite (issue 20, migration
0021_s7store_compact_ids): what is read is exactly what was written, order is kept,
PostgreSQL passes values through, and the migration rewrites existing rows both ways."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest
from alembic import command
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import DateTime, bindparam, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from cosigner.db import sqlite_compact as compact
from cosigner.db.migrate import alembic_config, upgrade
from tests.db.test_migrate import empty_database  # noqa: F401 - fixture
from tests.db.test_row_encoders import DIALECTS

SQLITE = DIALECTS["sqlite"]
PG = DIALECTS["postgresql"]
TEXT_DATETIME = sqlite.DATETIME()
IDS = (st.uuids().map(str) | st.uuids().map(lambda u: u.hex)
       | st.uuids().map(lambda u: str(u).upper()) | st.text(max_size=40)
       | st.text(alphabet="0123456789abcdef- ", min_size=30, max_size=38))
INSTANTS = st.builds(lambda moment, zone: moment.replace(tzinfo=zone),
                     st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)),
                     st.none() | st.sampled_from([UTC, timezone(timedelta(hours=-7))]))


@settings(max_examples=300, deadline=None)
@given(value=IDS)
def test_an_id_reads_back_exactly(value: str) -> None:
    for kind, compact_form in ((compact.UuidText(), str(uuid.UUID(int=0))),
                               (compact.HexId(), uuid.UUID(int=0).hex)):
        stored = kind.process_bind_param(value, SQLITE)
        assert isinstance(stored, bytes)
        assert kind.process_result_value(stored, SQLITE) == value
        canonical = (len(value) == len(compact_form) and value == value.lower()
                     and all(c in "0123456789abcdef" or (c == "-" and compact_form[i] == "-")
                             for i, c in enumerate(value))
                     and all(compact_form[i] != "-" or value[i] == "-"
                             for i in range(len(value))))
        assert (len(stored) == 16) == canonical
        assert kind.process_bind_param(value, PG) == value  # PostgreSQL: text as it is
        assert kind.process_result_value(value, PG) == value
        assert kind.process_result_value(value, SQLITE) == value  # a pre-0021 row


@settings(max_examples=200, deadline=None)
@given(a=st.uuids(), b=st.uuids())
def test_16_byte_ids_sort_as_their_texts(a: uuid.UUID, b: uuid.UUID) -> None:
    for kind, spell in ((compact.UuidText(), str), (compact.HexId(), lambda u: u.hex)):
        left, right = (kind.process_bind_param(spell(u), SQLITE) for u in (a, b))
        assert (left < right) == (spell(a) < spell(b))


@settings(max_examples=300, deadline=None)
@given(value=INSTANTS | st.dates(), other=INSTANTS)
def test_an_instant_reads_back_as_the_text_form_did(value: datetime | date,
                                                    other: datetime) -> None:
    kind = compact.Instant()
    stored = kind.process_bind_param(value, SQLITE)
    assert isinstance(stored, int)
    as_text = TEXT_DATETIME.bind_processor(SQLITE)(value)  # type: ignore[misc]
    before = TEXT_DATETIME.result_processor(SQLITE, None)(as_text)  # type: ignore[misc]
    assert kind.process_result_value(stored, SQLITE) == before
    assert kind.process_result_value(as_text, SQLITE) == before  # a pre-0021 row
    if isinstance(value, datetime):  # order of the integers = order of the texts
        other_stored = kind.process_bind_param(other, SQLITE)
        other_text = TEXT_DATETIME.bind_processor(SQLITE)(other)  # type: ignore[misc]
        assert (stored < other_stored) == (as_text < other_text)
        assert kind.process_bind_param(value, PG) is value
    with pytest.raises(TypeError):
        kind.process_bind_param("2026-12-01 00:00:00", SQLITE)


def _to(connection: Any, url: str, revision: str, down: bool = False) -> None:
    cfg = alembic_config(url)
    cfg.attributes["connection"] = connection
    (command.downgrade if down else command.upgrade)(cfg, revision)


async def _rows(conn: AsyncConnection, sql: str) -> list[Any]:
    return list((await conn.execute(text(sql))).all())


DECISION_IDS = [str(uuid.UUID(int=(i + 1) * 2**100 + i)) for i in range(5)] + ["not-a-uuid",
                                                                             "d" * 15]
JTIS = [uuid.UUID(int=(i + 1) * 2**90).hex for i in range(5)] + ["jti-x", "ABCDEF" * 5 + "00"]
AT = datetime(2026, 12, 1, 8, 0, 0, 123456, tzinfo=UTC)


def _sql(sql: str) -> Any:
    """``sql`` with ``:at`` / ``:red`` bound as the application binds instants."""
    binds = [bindparam(name, type_=DateTime(timezone=True)) for name in ("at", "red")
             if f":{name}" in sql]
    return text(sql).bindparams(*binds)


async def _seed(conn: AsyncConnection) -> None:
    for i, (key, jti) in enumerate(zip(DECISION_IDS, JTIS, strict=True)):
        at = AT + timedelta(seconds=i, microseconds=i)
        await conn.execute(_sql(
            "INSERT INTO decisions (id, tenant, request_id, request_hash, run_id, tool, "
            "args_hash, effect, caller, response, created_at) VALUES (:k, 't-s7', :r, :h, "
            "'r', 't', :h, 'allow', 'c', :v, :at)"),
            {"k": key, "r": f"r{i}", "h": b"\x00h", "v": b"\x01", "at": at})
        await conn.execute(text(
            "INSERT INTO call_inputs (decision_id, tenant, input, mask) VALUES (:d, 't-s7', "
            ":i, '[]')"), {"d": key, "i": b"\x01"})
        await conn.execute(_sql(
            "INSERT INTO permits (jti, tenant, decision_id, run_id, tool, args_hash, status, "
            "issued_at, expires_at, redeemed_at) VALUES (:j, 't-s7', :k, 'r', 't', :h, "
            "'issued', :at, :at, :red)"),
            {"j": jti, "k": key, "h": b"\x00h", "at": at, "red": at if i % 2 else None})
        await conn.execute(_sql(
            "INSERT INTO audit_events (tenant, seq, type, time, decision_id, permit_jti, "
            "body, hash) VALUES ('t-s7', :s, 'x', :at, :k, :j, :b, :h)"),
            {"s": i + 1, "at": at, "k": key, "j": jti, "b": b"\x01", "h": b"\x00h"})


async def _read(conn: AsyncConnection) -> list[Any]:
    return [await _rows(conn, "SELECT id, created_at FROM decisions WHERE tenant = 't-s7' "
                        "ORDER BY rowid" if conn.dialect.name == "sqlite" else
                        "SELECT id, created_at FROM decisions WHERE tenant = 't-s7' "
                        "ORDER BY request_id"),
            await _rows(conn, "SELECT decision_id FROM call_inputs WHERE tenant = 't-s7'"),
            await _rows(conn, "SELECT jti, decision_id, issued_at, redeemed_at FROM permits "
                        "WHERE tenant = 't-s7' ORDER BY issued_at"),
            await _rows(conn, "SELECT decision_id, permit_jti, time FROM audit_events "
                        "WHERE tenant = 't-s7' ORDER BY seq")]


async def test_upgrade_down_and_up_again_with_rows(empty_database: str) -> None:  # noqa: F811
    url = empty_database
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0020_s5store_facts_once")
            await _seed(conn)
        async with engine.connect() as conn:
            before = await _read(conn)
        await upgrade(url)
        async with engine.connect() as conn:
            raw = await _read(conn)
        sqlite_db = engine.dialect.name == "sqlite"
        if sqlite_db:
            assert [len(k) for k, _ in raw[0]] == [16] * 5 + [11, 17]
            assert [type(t) for _, t in raw[0]] == [int] * 7
            assert sorted(len(k) for (k,) in raw[1]) == [11, 16, 16, 16, 16, 16, 17]
            assert [len(j) for j, *_ in raw[2]] == [16] * 5 + [6, 33]
            assert [r is None or type(r) is int for *_, r in raw[2]] == [True] * 7
        else:
            assert raw == before  # PostgreSQL: nothing changes
        # What the application reads through the tables' types: the same values.
        from sqlalchemy import select

        from cosigner.db.tables import audit_events, decisions, permits
        from cosigner.db.tables_approvals import call_inputs
        async with engine.connect() as conn:
            ids = (await conn.execute(select(decisions.c.id, decisions.c.created_at)
                                      .where(decisions.c.tenant == "t-s7")
                                      .order_by(decisions.c.request_id))).all()
            events = (await conn.execute(
                select(audit_events.c.decision_id, audit_events.c.permit_jti,
                       audit_events.c.time).where(audit_events.c.tenant == "t-s7",
                                                  audit_events.c.time > AT)
                .order_by(audit_events.c.seq))).all()
            joined = (await conn.execute(
                select(permits.c.jti, call_inputs.c.decision_id)
                .join(call_inputs, call_inputs.c.decision_id == permits.c.decision_id)
                .where(permits.c.jti == JTIS[2]))).all()
        wall = [(AT + timedelta(seconds=i, microseconds=i)) for i in range(7)]
        if sqlite_db:
            wall = [w.replace(tzinfo=None) for w in wall]
        assert [(k, t) for k, t in ids] == list(zip(DECISION_IDS, wall, strict=True))
        assert [tuple(e) for e in events] == list(zip(DECISION_IDS, JTIS, wall, strict=True))[1:]
        assert [tuple(j) for j in joined] == [(JTIS[2], DECISION_IDS[2])]
        async with engine.begin() as conn:  # and back: what 0020's code reads
            await conn.run_sync(_to, url, "0020_s5store_facts_once", True)
        async with engine.connect() as conn:
            assert await _read(conn) == before
        await upgrade(url)
        async with engine.connect() as conn:
            assert await _read(conn) == raw
    finally:
        await engine.dispose()
        await asyncio.sleep(0)
