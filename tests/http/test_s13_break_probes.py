"""Session 13 adversarial probes (redeem vouched for by the token digest, Rego result
memo, approval join on the raw path). Each probe that found a defect fails before its
fix."""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from cosigner.core.errors import Unavailable
from cosigner.db.tables import audit_events
from cosigner.keys.signed_memo import SignedMemo
from cosigner.permits import redeem as redeem_module
from tests.conftest import Harness
from tests.http.approval_helpers import (
    decide,
    needs,
    redeem,
    refund_args,
    review,
    scripted,
    scripted_harness,
    state,
)
from tests.http.raw_rows import chain_holds
from tests.http.test_raw_join import Ways
from tests.permits.test_minted_digest import _b64, _minted, _payload


@pytest.mark.parametrize("member", ["jti", "decision_id", "approval_id"])
@pytest.mark.parametrize("bad", ["\u0000", "\ud800", "x" * 5000])
async def test_s13_forged_claim_text_the_database_cannot_bind_is_bad_signature(
        harness: Harness, tenant: str, member: str, bad: str) -> None:
    """A forged token (any signature) whose payload names the caller's tenant and a jti,
    decision id or approval id the database cannot take as text (NUL: PostgreSQL; a lone
    surrogate: neither driver) is refused ``bad_signature`` and logged, as before the
    pre-read: never a 500/503 from reading the row a forged payload names."""
    runtime, token = await _minted(harness, tenant)
    header, _, signature = token.split(".")
    claims = _payload(token)
    claims[member] = bad
    text = json.dumps(claims, separators=(",", ":"))  # ensure_ascii: \\u escapes
    forged = f"{header}.{_b64(text.encode())}.{signature}"
    resp = await redeem(harness, runtime, forged, "issue_refund", refund_args(5000))
    assert (resp.status_code, resp.json()["code"]) == (403, "bad_signature"), resp.text
    async with harness.db.read() as conn:
        refused = (await conn.execute(select(audit_events.c.body).where(
            audit_events.c.tenant == tenant,
            audit_events.c.type == "permit.refused"))).scalars().all()
    assert [json.loads(body)["payload"]["code"] for body in refused] == ["bad_signature"]
    ok = await redeem(harness, runtime, token, "issue_refund", refund_args(5000))
    assert ok.status_code == 200, ok.text


# --- approval join on the raw path ------------------------------------------------------


@pytest.fixture
async def sh(harness_factory: Callable[..., Any], tmp_path: Path) -> Harness:
    return await scripted_harness(harness_factory, tmp_path, log_batch_wait_ms=50)


async def test_s13_the_same_call_in_two_tenants_in_one_batch_never_joins_across(
        sh: Harness, tenant: str) -> None:
    """Two tenants send the identical call (same run id, tool, args) in one batch: each
    opens its own request and its other decisions join that one; a reviewer of one
    tenant cannot see or review the other's."""
    other = tenant + "-b"
    runtimes = {t: await sh.headers(t, "runtime") for t in (tenant, other)}
    body = scripted(needs(("finance", 1)), run="run-shared")
    answers = await asyncio.gather(*(
        decide(sh, runtimes[t], {**body, "request_id": f"req-{t}-{i}"})
        for i in range(4) for t in (tenant, other)))
    ids = {t: {a["approval"]["id"] for a in answers[k::2]}
           for k, t in enumerate((tenant, other))}
    assert all(len(found) == 1 for found in ids.values()), ids
    assert ids[tenant].isdisjoint(ids[other])
    carol_b = await sh.headers(other, "finance", subject="carol")
    resp = await review(sh, carol_b, next(iter(ids[tenant])))
    assert resp.status_code == 404, resp.text
    for t in (tenant, other):
        async with sh.db.read() as conn:
            types = list((await conn.execute(select(audit_events.c.type).where(
                audit_events.c.tenant == t))).scalars())
        assert (types.count("approval.requested"), types.count("approval.joined")) == (1, 3)
        await chain_holds(sh, t)


@pytest.mark.parametrize("race", ["approved", "rejected", "cancel"])
async def test_s13_joins_racing_a_decision_of_their_twin_in_one_batch(
        sh: Harness, tenant: str, race: str) -> None:
    """Joins of a pending request sent together with an approve, a reject or a cancel
    of it: each join either came first (the twin pending, no review counted) or after
    (approved: a new request; rejected: deny; cancelled: a new request); never a join
    of a request no longer pending, and the chain verifies."""
    runtime = await sh.headers(tenant, "runtime")
    carol = await sh.headers(tenant, "finance", subject="carol")
    body = scripted(needs(("finance", 1)), run=f"run-race-{race}")
    first = await decide(sh, runtime, body)
    twin = first["approval"]["id"]

    async def decided() -> Any:
        if race == "cancel":
            return await sh.client.post(f"/v1/approvals/{twin}/cancel", headers=runtime)
        return await review(sh, carol, twin, decision=race)

    results = await asyncio.gather(decided(), *(
        decide(sh, runtime, {**body, "request_id": f"race-{i}"}) for i in range(6)))
    assert results[0].status_code == 200, results[0].text
    async with sh.db.read() as conn:
        rows = (await conn.execute(select(audit_events.c.type, audit_events.c.approval_id)
                                   .where(audit_events.c.tenant == tenant)
                                   .order_by(audit_events.c.seq))).all()
    closed = False
    for kind, approval_id in rows:
        if approval_id == twin and kind in (
                "approval.approved", "approval.rejected", "approval.cancelled"):
            closed = True
        if kind == "approval.joined":
            assert not (closed and approval_id == twin), rows
    assert closed, rows
    for answer in results[1:]:
        approval = answer["approval"]
        if answer["effect"] == "deny":
            assert race == "rejected"
            continue
        assert approval["status"] == "pending"
        if approval["id"] == twin:
            assert approval["progress"] == [{"role": "finance", "count": 1, "approved": 0}]
    await chain_holds(sh, tenant)


async def test_s13_forged_tokens_sharing_a_permits_read_do_not_touch_its_redeem(
        harness: Harness, tenant: str) -> None:
    """Forged tokens stating a real permit's claims (its read shared with the genuine
    redeems on PostgreSQL, :class:`cosigner.permits.redeem._Reads`; read first on the
    raw driver on SQLite) race the genuine token's redeems: every forgery is
    ``bad_signature``, the genuine token redeems exactly once."""
    runtime, token = await _minted(harness, tenant)
    harness.context.keyring._signed = SignedMemo()  # noqa: SLF001 - as another replica
    header, payload, signature = token.split(".")
    forged = []
    for i in range(8):
        raw = bytearray(base64.urlsafe_b64decode(signature + "=="))
        raw[i] ^= 1
        forged.append(f"{header}.{payload}.{_b64(bytes(raw))}")
    tokens = forged[:4] + [token] * 4 + forged[4:]
    answers = await asyncio.gather(*(
        redeem(harness, runtime, t, "issue_refund", refund_args(5000)) for t in tokens))
    codes = sorted((r.status_code, r.json().get("code", r.json().get("status")))
                   for r in answers)
    assert codes == sorted([(200, "redeemed")] + [(409, "already_redeemed")] * 3
                           + [(403, "bad_signature")] * 8), codes


async def test_s13_an_approval_bound_permit_vouched_for_by_its_digest(
        sh: Harness, tenant: str) -> None:
    """The counted roles are read with the row before the signature check: the genuine
    approved permit redeems (no memo), and the same payload stating another approval
    id is refused ``bad_signature`` without consuming the permit."""
    runtime = await sh.headers(tenant, "runtime")
    carol = await sh.headers(tenant, "finance", subject="carol")
    body = scripted(needs(("finance", 1)), run="run-bound")
    first = await decide(sh, runtime, body)
    assert (await review(sh, carol, first["approval"]["id"])).status_code == 200
    token = (await state(sh, runtime, first["approval"]["id"]))["permit"]["token"]
    sh.context.keyring._signed = SignedMemo()  # noqa: SLF001
    header, _, signature = token.split(".")
    claims = _payload(token)
    other = await decide(sh, runtime, scripted(needs(("finance", 1)), run="run-other"))
    claims["approval_id"] = other["approval"]["id"]
    forged = f"{header}.{_b64(json.dumps(claims, separators=(',', ':')).encode())}.{signature}"
    resp = await redeem(sh, runtime, forged, "delete_file", {"path": "/tmp/a"})
    assert (resp.status_code, resp.json()["code"]) == (403, "bad_signature"), resp.text
    ok = await redeem(sh, runtime, token, "delete_file", {"path": "/tmp/a"})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("fault", ["raw", "sqlalchemy"])
async def test_s13_a_database_error_in_the_pre_read_is_503_and_consumes_nothing(
        harness: Harness, tenant: str, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """The row read before the signature check fails (on SQLite's raw driver, or on the
    SQLAlchemy path PostgreSQL takes): 503, never a redeem; once it reads again the
    permit redeems once."""
    if (fault == "raw") != harness.db.is_sqlite:
        pytest.skip("SQLite files read on the raw driver, PostgreSQL through SQLAlchemy")
    runtime, token = await _minted(harness, tenant)
    harness.context.keyring._signed = SignedMemo()  # noqa: SLF001
    broken = {"on": True}
    statement = redeem_module._PERMIT_AND_INPUT_RAW  # noqa: SLF001
    read_on = redeem_module._read_on  # noqa: SLF001

    class Failing:
        def run(self, *args: Any) -> Any:
            if broken["on"]:
                raise OperationalError("SELECT", {},
                                       sqlite3.OperationalError("disk I/O error"))
            return statement.run(*args)

    async def failing_on(*args: Any) -> Any:
        if broken["on"]:
            raise Unavailable("the database is unavailable", code="storage_unavailable")
        return await read_on(*args)

    monkeypatch.setattr(redeem_module, "_PERMIT_AND_INPUT_RAW", Failing())
    monkeypatch.setattr(redeem_module, "_read_on", failing_on)
    resp = await redeem(harness, runtime, token, "issue_refund", refund_args(5000))
    assert resp.status_code == 503, resp.text
    broken["on"] = False
    ok = await redeem(harness, runtime, token, "issue_refund", refund_args(5000))
    assert ok.status_code == 200, ok.text


async def test_s13_joins_in_a_run_with_a_contract_are_counted_the_sqlalchemy_way(
        sh: Harness, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with a contract (tool limit 2) sends the same require_approval call 5 times
    in one batch: the raw path never joins there (the contract's counters are the
    SQLAlchemy way's), and the answers are those of the SQLAlchemy way alone."""
    runtime = await sh.headers(tenant, "runtime")
    answers: dict[str, list[tuple[str, int]]] = {}
    for way in ("raw", "core"):
        ways = Ways(monkeypatch)
        ways.force_core = way == "core"
        run = f"run-contract-{way}"
        resp = await sh.client.post("/v1/runs", headers=runtime, json={
            "run_id": run, "allowed_tools": ["delete_file"],
            "tool_limits": {"delete_file": 2}, "budget": {"max_tool_calls": 2},
            "deadline": "2100-01-01T00:00:00Z"})
        assert resp.status_code in (200, 201), resp.text
        body = scripted(needs(("finance", 1)), run=run)
        got = await asyncio.gather(*(decide(sh, runtime, {**body, "request_id": f"{way}-{i}"})
                                     for i in range(5)))
        assert "join_raw" not in ways.take()
        ids = {a["approval"]["id"] for a in got if a["approval"]}
        assert len(ids) <= 1
        answers[way] = sorted((a["effect"], len(a["reasons"])) for a in got)
        monkeypatch.undo()
    assert answers["raw"] == answers["core"], answers
    await chain_holds(sh, tenant)
