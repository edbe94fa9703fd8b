"""Lean storage (issue 20): compressed columns, raw driver inserts, replays from the guard."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select, text

from cosigner.audit.chain import verify_bodies
from cosigner.db import compressed
from cosigner.db.database import Database, UniqueViolation
from cosigner.db.raw_insert import insert_many
from cosigner.db.tables import audit_events, decisions
from cosigner.db.tables_approvals import call_inputs
from cosigner.db.zdict_v1 import DICTIONARY
from tests.conftest import Harness, decision_request


def test_dictionary_v1_is_frozen() -> None:
    # Every row compressed with v1 needs exactly these bytes to be read back.
    assert hashlib.sha256(DICTIONARY).hexdigest() == (
        "93a43ca9d9fa7f9cc01bfd7487dba1f91e5186df0e5b2865022c42442e972fe9")


@pytest.mark.parametrize("value", [
    "", "{}", '{"a":"é\\u2028","b":[1,2.5,null]}', "x" * 100_000,
    json.dumps({"k": "\U0001f600" * 50}, ensure_ascii=False)])
def test_compressed_text_round_trips_exactly(value: str) -> None:
    kind = compressed.CompressedText()
    stored = kind.process_bind_param(value, None)  # type: ignore[arg-type]
    assert stored is not None and stored[0] == compressed.V1
    assert kind.process_result_value(stored, None) == value  # type: ignore[arg-type]


def test_values_written_before_0017_read_back_unchanged() -> None:
    body = '{"seq":1,"type":"decision.made"}'
    kind, js = compressed.CompressedText(), compressed.CompressedJSON()
    assert kind.process_result_value(body, None) == body  # SQLite TEXT  # type: ignore[arg-type]
    assert kind.process_result_value(body.encode(), None) == body  # PG bytea  # type: ignore[arg-type]
    assert js.process_result_value('{"a":1}', None) == {"a": 1}  # type: ignore[arg-type]
    assert js.process_result_value(memoryview(b'{"a":1}'), None) == {"a": 1}  # type: ignore[arg-type]


def test_a_damaged_or_unknown_value_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown"):
        compressed.decompress(b"\x0fabc")  # 7 is a response form since 0024
    with pytest.raises(ValueError, match="damaged"):
        compressed.decompress(b"\x01not a zstd frame")


def test_json_beyond_64_bit_integers_round_trips() -> None:
    js = compressed.CompressedJSON()
    value = {"big": 2**70, "neg": -(2**65), "s": "x"}
    assert js.process_result_value(js.process_bind_param(value, None), None) == value  # type: ignore[arg-type]


async def test_raw_inserts_store_what_core_stores(database_url: str, tenant: str) -> None:
    db = Database(database_url)
    now = datetime(2026, 12, 1, 5, 0, 0, 123456, tzinfo=UTC)
    rows = [{"decision_id": f"{tenant}-{i}", "tenant": tenant,
             "input": {"args": {"n": i}, "big": 2**70}, "mask": ["/x"]} for i in range(2)]
    try:
        async with db.transaction() as conn:
            await insert_many(conn, call_inputs, rows[:1])  # raw driver on SQLite files
            await conn.execute(call_inputs.insert(), rows[1:])  # SQLAlchemy Core
        async with db.read() as conn:
            got = (await conn.execute(select(call_inputs.c.input, call_inputs.c.mask).where(
                call_inputs.c.tenant == tenant).order_by(call_inputs.c.decision_id))).all()
        assert [(r.input, r.mask) for r in got] == [(r["input"], r["mask"]) for r in rows]
        # A unique key the raw driver meets is SQLAlchemy's IntegrityError → UniqueViolation.
        with pytest.raises(UniqueViolation):
            async with db.transaction() as conn:
                await insert_many(conn, call_inputs, rows[:1])
        async with db.transaction() as conn:
            await insert_many(conn, decisions, [{
                "id": f"{tenant}-d", "tenant": tenant, "request_id": "r", "request_hash": "h",
                "run_id": "run", "tool": "t", "args_hash": "a", "effect": "allow",
                "caller": "c", "policy_id": None, "policy_version": None,
                "policy_revision": None, "response": {"x": 1}, "created_at": now}])
        async with db.read() as conn:
            row = (await conn.execute(select(decisions.c.created_at, decisions.c.response).where(
                decisions.c.id == f"{tenant}-d"))).one()
        assert row.response == {"x": 1}
        assert row.created_at.replace(tzinfo=UTC) == now
    finally:
        await db.dispose()


async def test_stored_events_are_compressed_and_still_chain(harness: Harness,
                                                            tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    for _ in range(3):
        resp = await harness.client.post("/v1/decisions", headers=headers,
                                         json=decision_request())
        assert resp.status_code == 200
    async with harness.db.read() as conn:
        raw = (await conn.execute(text(
            "SELECT body FROM audit_events WHERE tenant = :t ORDER BY seq"),
            {"t": tenant})).scalars().all()
        rows = (await conn.execute(select(audit_events.c.body, audit_events.c.hash).where(
            audit_events.c.tenant == tenant).order_by(audit_events.c.seq))).all()
    # form 1, or since 0023 the forms that leave prev_hash to the row before (and pair
    # a decision's two events in one frame): cosigner.db.event_row
    assert all(bytes(b)[0] in (compressed.V1, 4, 5, 6) for b in raw)
    assert {bytes(b)[0] for b in raw} >= {4, 5}
    assert sum(len(bytes(b)) for b in raw) < sum(len(r.body) for r in rows) / 3
    assert verify_bodies([(r.body, r.hash) for r in rows]) == (None, None)


async def test_a_retry_is_answered_by_the_batch_without_a_failed_insert(
        harness: Harness, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from cosigner.decisions import pdp

    headers = await harness.headers(tenant, "runtime")
    body = decision_request()
    first = (await harness.client.post("/v1/decisions", headers=headers, json=body)).json()

    async def no_fallback(*_a: object) -> None:
        raise AssertionError("the retry took the failed-insert path")

    monkeypatch.setattr(pdp, "_existing", no_fallback)
    second = await harness.client.post("/v1/decisions", headers=headers, json=body)
    assert second.status_code == 200 and second.json() == first
    body["args"]["amount_minor"] = 6000
    other = await harness.client.post("/v1/decisions", headers=headers, json=body)
    assert other.status_code == 409 and other.json()["code"] == "idempotency_conflict"
    async with harness.db.read() as conn:
        count = (await conn.execute(select(func.count()).select_from(decisions).where(
            decisions.c.tenant == tenant))).scalar_one()
    assert count == 1
