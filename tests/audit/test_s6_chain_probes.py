"""Review probes of the chain's short road (cosigner.audit.events.stored_body, the row
encoders, fastjson.canonical; session 6): concurrent decisions whose args take the fast
road and ones that must fall back (floats, keys beyond the BMP, always-masked names,
controls, U+2028, a ``masked_paths`` member) land in one group commit, are replayed
idempotently, and the tenant's export verifies; every stored text is the definition's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import rfc8785
from sqlalchemy import select

from cosigner.audit.verify import verify_export
from cosigner.core.canonical import hash_bytes
from cosigner.db.tables import audit_events
from tests.audit.conftest import export_lines, jwks
from tests.conftest import Harness, decision_request

_ODD_ARGS: list[dict[str, Any]] = [
    {"order_id": "o1", "amount_minor": 5000, "currency": "USD", "reason_code": "x"},
    {"f": 1.5, "g": 100000.0, "h": -0.0, "i": 1e21, "j": 5e-324},
    {"\U0001f600": 1, "\uffff": 2, "\ue000": 3, "a": "\U0001d11e"},
    {"api_key": "sk-live-should-hide", "nested": [{"Password": "p"}, {"x-api-key": "k"}]},
    {"ctl": "\x00\x01\x1f\x7f\u2028\u2029\"\\/", "masked_paths": ["/fake"]},
    {"deep": [[[[{"a": [1, True, None, "s"]}]]]], "n": 9007199254740991},
    {"İ": "kelvin \u212a", "TOKEN": 1},
]


async def _decide(h: Harness, runtime: dict[str, str], i: int, args: dict[str, Any],
                  request_id: str) -> Any:
    body = decision_request(request_id=request_id, args=args, tool={"name": "probe_tool"},
                            context={"note": f"probe {i}", "secret": "hidden~" + str(i)})
    resp = await h.client.post("/v1/decisions", headers=runtime, json=body)
    return resp.status_code, resp.json()


async def test_odd_events_in_one_batch_replay_and_verify(harness: Harness,
                                                         tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    auditor = await harness.headers(tenant, "auditor")
    ids = [f"probe-{i}-{tenant}" for i in range(len(_ODD_ARGS))]
    first = await asyncio.gather(*(_decide(harness, runtime, i, args, ids[i])
                                   for i, args in enumerate(_ODD_ARGS)))
    assert all(status == 200 for status, _ in first), first
    # a retry of each (same body) is answered with the first decision, in one batch too
    again = await asyncio.gather(*(_decide(harness, runtime, i, args, ids[i])
                                   for i, args in enumerate(_ODD_ARGS)))
    for (s1, d1), (s2, d2) in zip(first, again, strict=True):
        assert (s1, s2) == (200, 200)
        assert d1["decision_id"] == d2["decision_id"] and d1["args_hash"] == d2["args_hash"]
    for (_, decision), args in zip(first, _ODD_ARGS, strict=True):
        assert decision["args_hash"] == hash_bytes(rfc8785.dumps(args))
    await harness.client.post("/v1/audit/checkpoints", headers=auditor)
    # Lines split on LF only (export_lines): the canonical text writes U+2028 raw, which
    # str.splitlines would split on.
    lines = await export_lines(harness, auditor)
    assert any("\u2028" in line for line in lines)
    keys = await jwks(harness)
    report = verify_export(lambda: lines, keys)
    assert report.ok, report
    text = "".join(lines)
    for secret in ("sk-live-should-hide", "hidden~0", "hidden~3"):
        assert secret not in text
    assert "probe 4" in text  # the context reached the log (payload not empty)
    async with harness.db.read() as conn:
        rows = (await conn.execute(select(audit_events).where(
            audit_events.c.tenant == tenant).order_by(audit_events.c.seq))).mappings().all()
    assert len(rows) >= len(_ODD_ARGS)
    prev = None
    for row in rows:
        text = row["body"].encode()  # the stored RFC 8785 text that was hashed
        assert rfc8785.dumps(json.loads(text)) == text, row["seq"]
        assert hash_bytes(text) == row["hash"], row["seq"]
        assert prev is None or json.loads(text)["prev_hash"] == prev
        prev = row["hash"]


async def test_allow_batches_with_odd_context_verify(harness: Harness, tenant: str) -> None:
    """Allow decisions (the raw batch: sqlite3 executemany / asyncpg unnest, with the
    column encoders) carrying the odd values in their context."""
    runtime = await harness.headers(tenant, "runtime")
    auditor = await harness.headers(tenant, "auditor")

    async def allow(i: int, odd: dict[str, Any], rid: str) -> Any:
        body = decision_request(request_id=rid, context={"odd": odd, "k": i})
        resp = await harness.client.post("/v1/decisions", headers=runtime, json=body)
        return resp.status_code, resp.json()

    ids = [f"allow-{i}-{tenant}" for i in range(len(_ODD_ARGS))]
    for _ in range(2):  # first and the idempotent replay
        answers = await asyncio.gather(*(allow(i, odd, ids[i])
                                         for i, odd in enumerate(_ODD_ARGS)))
        assert [s for s, _ in answers] == [200] * len(_ODD_ARGS), answers
        assert {a["effect"] for _, a in answers} == {"allow"}
    await harness.client.post("/v1/audit/checkpoints", headers=auditor)
    resp = await harness.client.get("/v1/audit/export", headers=auditor,
                                    params={"format": "jsonl"})
    lines = resp.text.split("\n")[:-1]
    keys = await jwks(harness)
    report = verify_export(lambda: lines, keys)
    assert report.ok, report
    assert "sk-live-should-hide" not in resp.text
