"""POST /v1/decisions over HTTP (ASGI) against a real database."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from cosigner.audit.chain import GENESIS, verify_bodies
from cosigner.db.tables import audit_events, decisions
from tests.conftest import Harness, decision_request


async def post(h: Harness, headers: dict[str, str], body: object) -> object:
    return await h.client.post("/v1/decisions", headers=headers,
                               content=json.dumps(body) if not isinstance(body, bytes) else body)


@pytest.mark.parametrize(("amount", "effect"), [
    (5000, "allow"), (100000, "allow"), (150000, "require_approval"), (250000, "deny")])
async def test_refund_policy_effects(harness: Harness, tenant: str, amount: int,
                                     effect: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    body = decision_request()
    body["args"]["amount_minor"] = amount
    resp = await harness.client.post("/v1/decisions", headers=headers, json=body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert data["effect"] == effect
    assert data["policy"]["id"] == "refunds" and data["policy"]["revision"].startswith("sha256:")
    assert (data["permit"] is not None) == (effect == "allow")
    if effect == "require_approval":
        assert data["approval"]["require"] == [{"role": "finance", "count": 1}]


async def test_decision_and_event_committed_before_response(harness: Harness,
                                                            tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    resp = await harness.client.post("/v1/decisions", headers=headers, json=decision_request())
    decision_id = resp.json()["decision_id"]
    async with harness.db.read() as conn:
        row = (await conn.execute(select(decisions).where(decisions.c.id == decision_id))).one()
        events = (await conn.execute(
            select(audit_events.c.type).where(audit_events.c.tenant == tenant,
                                              audit_events.c.decision_id == decision_id)
        )).scalars().all()
    assert row.effect == "allow"
    assert sorted(events) == ["decision.made", "permit.minted"]


async def test_idempotent_retry_returns_first_decision_and_writes_nothing(
        harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    body = decision_request()
    first = (await harness.client.post("/v1/decisions", headers=headers, json=body)).json()
    async with harness.db.read() as conn:
        before = (await conn.execute(select(func.count()).select_from(audit_events)
                                     .where(audit_events.c.tenant == tenant))).scalar_one()
    second = (await harness.client.post("/v1/decisions", headers=headers, json=body)).json()
    async with harness.db.read() as conn:
        after = (await conn.execute(select(func.count()).select_from(audit_events)
                                    .where(audit_events.c.tenant == tenant))).scalar_one()
    assert first == second
    assert before == after


async def test_same_request_id_with_other_content_is_409(harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    body = decision_request()
    await harness.client.post("/v1/decisions", headers=headers, json=body)
    body["args"]["amount_minor"] = 6000
    resp = await harness.client.post("/v1/decisions", headers=headers, json=body)
    assert resp.status_code == 409
    assert resp.json()["code"] == "idempotency_conflict"


@pytest.mark.parametrize(("raw", "code"), [
    (b'{"request_id":"r","request_id":"s"}', "duplicate_key"),
    (b'{"request_id":"r","request\\u005fid":"s"}', "duplicate_key"),
    (b'{"args":{"a":NaN}}', "non_finite_number"),
    (b'{"args":{"a":Infinity}}', "non_finite_number"),
    (b'{"args":{"account_id":9007199254740993}}', "unsafe_integer"),
])
async def test_strict_json_rejections(harness: Harness, tenant: str, raw: bytes,
                                      code: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    resp = await harness.client.post("/v1/decisions", headers=headers, content=raw)
    assert resp.status_code == 422
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert resp.json()["code"] == code


async def test_k25_unknown_field_rejected(harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    resp = await harness.client.post("/v1/decisions", headers=headers,
                                     json=decision_request(skip_approval=True))
    assert resp.status_code == 422
    assert resp.json()["code"] == "validation_failed"


@pytest.mark.parametrize("args", [None, "{\"amount_minor\": 5}", [1, 2]])
async def test_k03_args_must_be_an_object(harness: Harness, tenant: str, args: object) -> None:
    headers = await harness.headers(tenant, "runtime")
    resp = await harness.client.post("/v1/decisions", headers=headers,
                                     json=decision_request(args=args))
    assert resp.status_code == 422


async def test_refused_requests_are_logged(harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    await harness.client.post("/v1/decisions", headers=headers,
                              json=decision_request(skip_approval=True))
    async with harness.db.read() as conn:
        types = (await conn.execute(select(audit_events.c.type)
                                    .where(audit_events.c.tenant == tenant))).scalars().all()
    # Creating the key logged principal.created; the refused request adds only its refusal.
    assert [t for t in types if not t.startswith("principal.")] == ["request.refused"]


async def test_malformed_json_is_400_problem(harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    resp = await harness.client.post("/v1/decisions", headers=headers, content=b"{nope")
    assert resp.status_code == 400
    assert resp.json()["code"] == "invalid_json"


async def test_body_over_limit_is_413(harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    body = decision_request(context={"blob": "x" * 300_000})
    resp = await harness.client.post("/v1/decisions", headers=headers, json=body)
    assert resp.status_code == 413
    assert resp.json()["code"] == "payload_too_large"


async def test_missing_or_bad_key_is_401(harness: Harness) -> None:
    resp = await harness.client.post("/v1/decisions", json=decision_request())
    assert resp.status_code == 401
    resp = await harness.client.post("/v1/decisions", json=decision_request(),
                                     headers={"Authorization": "Bearer csk_0000000000000000_"
                                              + "A" * 43})
    assert resp.status_code == 401


async def test_wrong_role_is_403(harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "auditor")
    resp = await harness.client.post("/v1/decisions", headers=headers, json=decision_request())
    assert resp.status_code == 403


async def test_tenant_comes_from_key_and_is_isolated(harness: Harness, tenant: str) -> None:
    other = tenant + "-b"
    a = await harness.headers(tenant, "runtime")
    b = await harness.headers(other, "runtime")
    body = decision_request()
    first = (await harness.client.post("/v1/decisions", headers=a, json=body)).json()
    # Same request_id under tenant B is a different decision, not A's replayed.
    second = (await harness.client.post("/v1/decisions", headers=b, json=body)).json()
    assert first["decision_id"] != second["decision_id"]
    async with harness.db.read() as conn:
        tenants = (await conn.execute(select(decisions.c.tenant).where(
            decisions.c.request_id == body["request_id"]))).scalars().all()
    assert sorted(tenants) == sorted([tenant, other])


async def test_chain_links_every_event(harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    for amount in (1, 150000, 250000, 99):
        body = decision_request()
        body["args"]["amount_minor"] = amount
        await harness.client.post("/v1/decisions", headers=headers, json=body)
    async with harness.db.read() as conn:
        rows = (await conn.execute(select(audit_events.c.body, audit_events.c.hash)
                                   .where(audit_events.c.tenant == tenant)
                                   .order_by(audit_events.c.seq))).all()
    types = [json.loads(r.body)["type"] for r in rows]
    assert types.count("decision.made") == 4 and types.count("permit.minted") == 2
    assert verify_bodies([(r.body, r.hash) for r in rows]) == (None, None)
    assert json.loads(rows[0].body)["prev_hash"] == GENESIS
    tampered = [(r.body, r.hash) for r in rows]
    at = next(i for i, (body, _) in enumerate(tampered)
              if '"effect":"require_approval"' in body)
    tampered[at] = (tampered[at][0].replace('"require_approval"', '"allow"'), tampered[at][1])
    assert verify_bodies(tampered) == (at + 1, "hash_mismatch")


async def test_database_gone_gives_503_never_allow(harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    await harness.client.post("/v1/decisions", headers=headers, json=decision_request())
    # Point the engine at a database that cannot be opened: every write fails.
    await harness.db.engine.dispose()
    from sqlalchemy.ext.asyncio import create_async_engine

    harness.db.engine = create_async_engine(
        "sqlite+aiosqlite:////nonexistent-dir/cosigner.db")
    from cosigner.db.database import _configure_sqlite

    _configure_sqlite(harness.db.engine, 100)
    if harness.db.sqlite_write_connection is not None:  # the batches' kept connection too
        from cosigner.db.sqlite_inline import WriterConnection

        await harness.db.sqlite_write_connection.close()
        harness.db.sqlite_write_connection = WriterConnection(
            "/nonexistent-dir/cosigner.db", busy_timeout_ms=100)
    # The key is still cached from the first call, so the failure is the decision's own.
    resp = await harness.client.post("/v1/decisions", headers=headers, json=decision_request())
    assert resp.status_code == 503
    assert resp.json()["code"] == "storage_unavailable"
    assert "permit" not in resp.json()
