"""Facts stored once (issue 20, migration 0020_s5store_facts_once): a decision's permit
token stored decoded inside its answer's frame and rebuilt byte for byte; the upgrade
of a database that already holds rows."""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from alembic import command
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from cosigner.db import compressed, digest
from cosigner.db.migrate import alembic_config
from cosigner.db.sqlite_compact import UuidText
from tests.conftest import Harness, decision_request
from tests.db.test_migrate import empty_database  # noqa: F401 - fixture

RESPONSE = compressed.ResponseJSON()


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def answer(token: str | None, **extra: Any) -> dict[str, Any]:
    return {"decision_id": "01a230a8-db49-73a4-8ae1-4650a9d5f7a4", "request_id": "r-1",
            "effect": "allow", "reasons": [{"code": "ok", "message": "é ✓"}],
            "policy": {"id": "p", "version": "1", "revision": "sha256:" + "ab" * 32},
            "args_hash": "sha256:" + "cd" * 32,
            "permit": None if token is None else {"token": token, "jti": "j",
                                                  "expires_at": "2026-12-02T08:11:42Z"},
            "approval": None, **extra}


def read_back(value: Any) -> Any:
    stored = RESPONSE.process_bind_param(value, None)  # type: ignore[arg-type]
    return stored, RESPONSE.process_result_value(stored, None)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(header=st.binary(max_size=120), claims=st.binary(max_size=600),
       signature=st.binary(max_size=80),
       extra=st.dictionaries(st.text(max_size=5),
                             st.integers(-(2**63), 2**63 - 1) | st.text(), max_size=3))
def test_a_token_is_rebuilt_byte_for_byte(header: bytes, claims: bytes, signature: bytes,
                                          extra: dict[str, Any]) -> None:
    # Merged, not passed as keywords: a generated key "token" would clash with the parameter.
    value = {**answer(".".join(b64url(raw) for raw in (header, claims, signature))), **extra}
    stored, back = read_back(value)
    assert stored[0] == compressed.V2_TOKEN
    assert orjson.dumps(back) == orjson.dumps(value)  # same keys, order and values
    assert compressed.decompress(stored) == orjson.dumps(value)


@pytest.mark.parametrize("token", [
    "a.b",  # not three segments
    "eyJ9.e30.AB",  # "AB" is a second spelling of the byte b"\x00" ("AA")
    "e30.e30.a=",  # padded
    "e30.e30.$$",  # not base64url
])
def test_a_token_not_spelled_canonically_is_kept_as_written(token: str) -> None:
    stored, back = read_back(answer(token))
    assert stored[0] == compressed.V1
    assert back == answer(token)


def test_answers_without_a_permit_are_form_1() -> None:
    for value in (answer(None), {"permit": {"token": 5}}, [1, 2], {"x": 2**70}):
        stored, back = read_back(value)
        assert stored[0] == compressed.V1 and back == value


async def test_a_replay_is_byte_identical_and_the_token_stored_decoded(
        harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    body = decision_request()
    first = await harness.client.post("/v1/decisions", headers=headers, json=body)
    again = await harness.client.post("/v1/decisions", headers=headers, json=body)
    assert first.status_code == again.status_code == 200
    assert first.json()["permit"]["token"]
    assert again.content == first.content
    async with harness.db.read() as conn:
        stored = (await conn.execute(text(  # the id bound as the column binds it (0021)
            "SELECT response FROM decisions WHERE id = :id").bindparams(
                bindparam("id", type_=UuidText())),
            {"id": first.json()["decision_id"]})).scalar_one()
    # Form 8 (session 14): an allow as the facts it is built from - neither the token,
    # nor its header or claims, nor any text its row's columns hold.
    assert bytes(stored)[0] == compressed.V8_FACTS
    made = first.json()
    header, claims, _ = made["permit"]["token"].split(".")
    for text_ in (made["permit"]["token"], header, claims, made["decision_id"],
                  made["request_id"], made["args_hash"], made["policy"]["revision"]):
        assert text_.encode() not in bytes(stored)


@settings(max_examples=200, deadline=None)
@given(value=st.text(max_size=80) | st.binary(min_size=32, max_size=32).map(
    lambda raw: "sha256:" + raw.hex()))
def test_a_hash_text_reads_back_exactly(value: str) -> None:
    kind = digest.Sha256Digest()
    stored = kind.process_bind_param(value, None)  # type: ignore[arg-type]
    assert stored is not None
    assert kind.process_result_value(stored, None) == value  # type: ignore[arg-type]
    assert (len(stored) == 32) == (value.startswith("sha256:") and len(value) == 71
                                   and value == value.lower())


def _to(connection: Any, url: str, revision: str) -> None:
    cfg = alembic_config(url)
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, revision)


def _down(connection: Any, url: str) -> None:
    cfg = alembic_config(url)
    cfg.attributes["connection"] = connection
    command.downgrade(cfg, "0019_bounded_pending")


async def _rows(conn: AsyncConnection, sql: str) -> list[Any]:
    return list((await conn.execute(text(sql))).all())


async def test_upgrade_rewrites_existing_rows(empty_database: str) -> None:  # noqa: F811
    url = empty_database
    engine = create_async_engine(url)
    token = ".".join(b64url(raw) for raw in (b'{"alg":"EdDSA"}', b'{"jti":"j"}', b"\x07" * 64))
    old = {f"d{i}": answer(token if i % 3 else None, decision_id=f"d{i}") for i in range(7)}
    old["d5"] = answer("not.a.tok=en", decision_id="d5")
    now = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0019_bounded_pending")
            for i, (key, value) in enumerate(old.items()):
                # d0: written before 0017 (plain JSON text / its UTF-8 bytes).
                stored: Any = (orjson.dumps(value) if i == 0
                               else compressed.compress(orjson.dumps(value)))
                if i == 0 and conn.dialect.name == "sqlite":
                    stored = stored.decode()
                await conn.execute(text(
                    "INSERT INTO decisions (id, tenant, request_id, request_hash, run_id, "
                    "tool, args_hash, effect, caller, response, created_at) VALUES (:k, "
                    "'t-mig', :k, :h, 'r', 't', 'a', 'allow', 'c', :v, :at)"),
                    {"k": key, "v": stored, "at": now, "h": "sha256:" + f"{i:02x}" * 32})
                await conn.execute(text(
                    "INSERT INTO call_inputs (decision_id, tenant, input, mask) "
                    "VALUES (:d, 't-mig', :i, '[]')"), {"d": key, "i": compressed.compress(
                        orjson.dumps({"args": {"n": i}}))})
                await conn.execute(text(
                    "INSERT INTO permits (jti, tenant, decision_id, run_id, tool, args_hash, "
                    "status, issued_at, expires_at) VALUES (:k, 't-mig', :k, 'r', 't', :h, "
                    "'issued', :at, :at)"), {"k": key, "at": now, "h": "sha256:" + "9f" * 32})
                await conn.execute(text(
                    "INSERT INTO audit_events (tenant, seq, type, time, body, hash) "
                    "VALUES ('t-mig', :s, 'x', :at, :b, :h)"),
                    {"s": i + 1, "at": now, "b": compressed.compress(b"{}"),
                     "h": "sha256:" + f"{i:02x}" * 32 if i != 6 else "not a digest"})
        async with engine.begin() as conn:  # 0020 itself (0021 then packs the ids)
            await conn.run_sync(_to, url, "0020_s5store_facts_once")
        async with engine.connect() as conn:
            rows = await _rows(conn, "SELECT id, response FROM decisions ORDER BY id")
            request_hashes = await _rows(conn, "SELECT request_hash, args_hash FROM "
                                         "decisions ORDER BY id")
            inputs = await _rows(conn, "SELECT decision_id, input FROM call_inputs "
                                 "ORDER BY decision_id")
            permit_hashes = await _rows(conn, "SELECT args_hash FROM permits")
            hashes = await _rows(conn, "SELECT seq, hash FROM audit_events "
                                 "WHERE tenant = 't-mig' ORDER BY seq")
            if conn.dialect.name == "sqlite":
                sql = (await conn.execute(text("SELECT sql FROM sqlite_master WHERE name = "
                                               "'call_inputs'"))).scalar_one()
                assert "WITHOUT ROWID" in sql
        forms = {key: bytes(value)[0] for key, value in rows}
        assert forms == {"d0": 1, "d1": 2, "d2": 2, "d3": 1, "d4": 2, "d5": 1, "d6": 1}
        for key, value in rows:
            assert orjson.dumps(RESPONSE.process_result_value(value, None)) == orjson.dumps(
                old[key])
        assert [(digest.unpack(h), digest.unpack(a)) for h, a in request_hashes] == [
            ("sha256:" + f"{i:02x}" * 32, "a") for i in range(7)]
        assert [len(bytes(h)) for h, _ in request_hashes] == [32] * 7
        assert [bytes(h) for (h,) in permit_hashes] == [bytes.fromhex("9f" * 32)] * 7
        assert [len(bytes(h)) for _, h in hashes] == [32] * 6 + [13]
        assert [digest.unpack(h) for _, h in hashes] == [
            "sha256:" + f"{i:02x}" * 32 for i in range(6)] + ["not a digest"]
        assert [(d, orjson.loads(compressed.decompress(i))) for d, i in inputs] == [
            (f"d{i}", {"args": {"n": i}}) for i in range(7)]
        async with engine.begin() as conn:  # and back: what 0019's code reads
            await conn.run_sync(_down, url)
        async with engine.connect() as conn:
            down = await _rows(conn, "SELECT id, response, request_hash FROM decisions "
                               "ORDER BY id")
            event_hashes = await _rows(conn, "SELECT hash FROM audit_events "
                                       "WHERE tenant = 't-mig' ORDER BY seq")
        assert {bytes(r)[0] if not isinstance(r, str) else r[0] for _, r, _ in down} <= {
            1, "{"}
        assert [orjson.loads(compressed.decompress(r)) for _, r, _ in down] == list(
            old.values())
        assert [h for _, _, h in down] == ["sha256:" + f"{i:02x}" * 32 for i in range(7)]
        assert [h for (h,) in event_hashes] == [
            "sha256:" + f"{i:02x}" * 32 for i in range(6)] + ["not a digest"]
    finally:
        await engine.dispose()
        await asyncio.sleep(0)
