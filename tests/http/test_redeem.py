"""POST /v1/permits/redeem and /revoke: binding, single use, forged tokens (K09, K10, K17,
K18), time-of-use policy re-check, 200 concurrent redeems."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.core.clock import FrozenClock
from cosigner.db.tables import audit_events
from cosigner.keys.keyring import Keyring
from cosigner.permits.tokens import PERMIT_TYP
from tests.conftest import Harness, decision_request
from tests.http.approval_helpers import (
    decide,
    needs,
    redeem,
    refund_args,
    review,
    scripted,
    state,
    write_scripted_bundle,
)

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


async def approved_refund(h: Harness, tenant: str, runtime: dict[str, str],
                          amount: int = 150_000, approver: str = "alice") -> str:
    """Decision → approval → finance approval; returns the permit token."""
    body = decision_request(run={"id": f"run-{approver}-{amount}"}, args=refund_args(amount))
    approval_id = (await decide(h, runtime, body))["approval"]["id"]
    finance = await h.headers(tenant, "finance", subject=approver)
    assert (await review(h, finance, approval_id)).json()["status"] == "approved"
    token: str = (await state(h, runtime, approval_id))["permit"]["token"]
    return token


async def approved_deletes(h: Harness, tenant: str, runtime: dict[str, str],
                           outcome: dict[str, Any]) -> list[str]:
    """Permit tokens of ``delete_file`` on ``/1`` and ``/2``, each decided with the
    scripted ``outcome`` (a ``require_approval``) and approved by finance's alice."""
    alice = await h.headers(tenant, "finance", subject="alice")
    tokens = []
    for path in ("/1", "/2"):
        approval_id = (await decide(h, runtime, scripted(outcome, args={"path": path}))
                       )["approval"]["id"]
        assert (await review(h, alice, approval_id)).status_code == 200
        tokens.append((await state(h, runtime, approval_id))["permit"]["token"])
    return tokens


async def refusal(resp: Any) -> tuple[int, str]:
    return resp.status_code, resp.json()["code"]


# --- the refund case: every misuse of an approved permit fails with its code --------------


async def test_refund_permit_misuse_codes(harness: Harness, tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    token = await approved_refund(harness, tenant, runtime)
    changed = refund_args()
    changed["amount_minor"] = 150_001
    assert await refusal(await redeem(harness, runtime, token, "issue_refund", changed)) == (
        403, "args_mismatch")
    assert await refusal(await redeem(harness, runtime, token, "get_order",
                                      refund_args())) == (403, "tool_mismatch")
    other = await harness.headers(f"{tenant}-b", "runtime")
    assert await refusal(await redeem(harness, other, token, "issue_refund",
                                      refund_args())) == (403, "tenant_mismatch")
    # 150000.0 hashes like 150000 (RFC 8785) but fails the catalogue's strict integer.
    resp = await harness.client.post(
        "/v1/permits/redeem", headers=runtime,
        content=json.dumps({"permit": token, "tool": "issue_refund", "args": refund_args()}
                           ).replace("150000", "150000.0"))
    assert await refusal(resp) == (403, "invalid_args")
    # Key order does not matter: same canonical arguments, same call.
    same = dict(reversed(list(refund_args().items())))
    resp = await redeem(harness, runtime, token, "issue_refund", same)
    assert resp.status_code == 200, resp.text
    assert await refusal(await redeem(harness, runtime, token, "issue_refund",
                                      refund_args())) == (409, "already_redeemed")


async def test_revoked_permit_is_refused(harness: Harness, tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    token = await approved_refund(harness, tenant, runtime)
    jti = json.loads(unb64(token.split(".")[1]))["jti"]
    resp = await harness.client.post(f"/v1/permits/{jti}/revoke", headers=runtime)
    assert resp.status_code == 403  # runtime alone may not revoke
    other_admin = await harness.headers(f"{tenant}-b", "admin")
    resp = await harness.client.post(f"/v1/permits/{jti}/revoke", headers=other_admin)
    assert resp.status_code == 404
    approver = await harness.headers(tenant, "finance", subject="bob")
    resp = await harness.client.post(f"/v1/permits/{jti}/revoke", headers=approver)
    assert resp.json() == {"jti": jti, "status": "revoked"}
    assert await refusal(await redeem(harness, runtime, token, "issue_refund",
                                      refund_args())) == (409, "revoked")


async def test_redeemed_permit_cannot_be_revoked(harness: Harness, tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    token = await approved_refund(harness, tenant, runtime)
    assert (await redeem(harness, runtime, token, "issue_refund", refund_args())
            ).status_code == 200
    jti = json.loads(unb64(token.split(".")[1]))["jti"]
    admin = await harness.headers(tenant, "admin")
    resp = await harness.client.post(f"/v1/permits/{jti}/revoke", headers=admin)
    assert await refusal(resp) == (409, "already_redeemed")


async def test_k18_permit_expires_with_the_approval(
        harness_factory: Callable[..., Any], tenant: str) -> None:
    clock = FrozenClock(T0)
    h: Harness = await harness_factory(clock=clock)
    runtime = await h.headers(tenant, "runtime")
    token = await approved_refund(h, tenant, runtime)
    claims = json.loads(unb64(token.split(".")[1]))
    assert claims["exp"] - claims["iat"] == 1800  # the request's remaining validity
    assert claims["approvers"] == [{"id": "alice", "role": "finance",
                                    "at": int(T0.timestamp())}]
    clock.advance(seconds=1799)
    # now == exp - 1: still valid, but first check exp == now on a second permit.
    clock.advance(seconds=1)
    assert await refusal(await redeem(h, runtime, token, "issue_refund",
                                      refund_args())) == (409, "expired")


async def test_allow_permit_redeems_and_policy_change_refuses(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    root = write_scripted_bundle(tmp_path / "b")
    h: Harness = await harness_factory(bundle_dirs=[root])
    runtime = await h.headers(tenant, "runtime")
    kept = await decide(h, runtime, scripted({"effect": "allow"}, args={"path": "/1"}))
    stale = await decide(h, runtime, scripted({"effect": "allow"}, args={"path": "/2"}))
    assert (await redeem(h, runtime, kept["permit"]["token"], "delete_file",
                         {"path": "/1"})).status_code == 200
    # The operator tightens the policy: every call now needs approval.
    write_scripted_bundle(root, rules='return {"effect": "deny", "reasons": ["frozen"]}')
    h.context.store.reload()
    assert await refusal(await redeem(h, runtime, stale["permit"]["token"], "delete_file",
                                      {"path": "/2"})) == (409, "policy_changed")


async def test_approved_permit_survives_an_unchanged_requirement_only(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    root = write_scripted_bundle(tmp_path / "b")
    h: Harness = await harness_factory(bundle_dirs=[root])
    runtime = await h.headers(tenant, "runtime")
    tokens = await approved_deletes(h, tenant, runtime, needs(("finance", 1)))
    assert (await redeem(h, runtime, tokens[0], "delete_file", {"path": "/1"})
            ).status_code == 200
    # Now two groups are needed: the single finance approval no longer suffices.
    write_scripted_bundle(root, rules=(
        'return {"effect": "require_approval", "approval": {"require": '
        '[{"role": "finance", "count": 1}, {"role": "security", "count": 1}]}}'))
    h.context.store.reload()
    assert await refusal(await redeem(h, runtime, tokens[1], "delete_file",
                                      {"path": "/2"})) == (409, "policy_changed")


@pytest.mark.parametrize("tightened", [
    {"distinct_from": "initiator_and_previous"},
    {"distinct_from": "initiator", "assurance": "mfa"},
    {"distinct_from": "initiator", "max_auth_age_s": 300},
    {"distinct_from": "initiator", "signed": True},
], ids=["distinct_from", "assurance", "max_auth_age", "signature"])
async def test_an_approved_permit_is_refused_once_the_policy_judges_reviews_more_strictly(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str,
        tightened: dict[str, Any]) -> None:
    """The same group and count, but the active policy now asks more of each review than
    the rules the approval was judged by (separation of duties, step-up, a signature): the
    permit minted before is refused at redeem (time-of-use, fail closed), as a changed
    quorum is; the refusal is logged."""
    root = write_scripted_bundle(tmp_path / "b")
    h: Harness = await harness_factory(bundle_dirs=[root])
    runtime = await h.headers(tenant, "runtime")
    tokens = await approved_deletes(h, tenant, runtime,
                                    needs(("finance", 1), distinct_from="initiator"))
    group: dict[str, Any] = {"role": "finance", "count": 1}
    if tightened.pop("signed", False):
        group["signature"] = "webauthn"
    approval = {"require": [group], "timeout_ms": 600_000, **tightened}
    write_scripted_bundle(root, rules="return " + repr(
        {"effect": "require_approval", "reasons": ["scripted"], "approval": approval}))
    h.context.store.reload()
    assert await refusal(await redeem(h, runtime, tokens[0], "delete_file",
                                      {"path": "/1"})) == (409, "policy_changed")
    # The same rules as the approval's again: the other permit redeems.
    write_scripted_bundle(root, rules="return " + repr(needs(("finance", 1),
                                                              distinct_from="initiator")))
    h.context.store.reload()
    assert (await redeem(h, runtime, tokens[1], "delete_file", {"path": "/2"})
            ).status_code == 200
    async with h.context.db.read() as conn:
        types = (await conn.execute(select(audit_events.c.type).where(
            audit_events.c.tenant == tenant, audit_events.c.type.like("permit.%"))
        )).scalars().all()
    assert types.count("permit.refused") == 1 and "permit.redeemed" in types, types


# --- K09: a permit is bound to its own call -----------------------------------------------


async def test_k09_first_permit_never_redeems_the_second_pending_call(
        sh_factory: Callable[..., Any], tenant: str) -> None:
    h: Harness = await sh_factory()
    runtime = await h.headers(tenant, "runtime")
    alice = await h.headers(tenant, "finance", subject="alice")
    first = await decide(h, runtime, scripted(needs(("finance", 1)), run="run-k09",
                                              args={"path": "/srv/a.txt"}))
    second = await decide(h, runtime, scripted(needs(("finance", 1)), run="run-k09",
                                               args={"path": "/srv/b.txt"}))
    assert first["approval"]["id"] != second["approval"]["id"]
    await review(h, alice, first["approval"]["id"])
    token = (await state(h, runtime, first["approval"]["id"]))["permit"]["token"]
    assert await refusal(await redeem(h, runtime, token, "delete_file",
                                      {"path": "/srv/b.txt"})) == (403, "args_mismatch")
    assert (await state(h, runtime, second["approval"]["id"]))["status"] == "pending"
    assert (await redeem(h, runtime, token, "delete_file", {"path": "/srv/a.txt"})
            ).status_code == 200
    assert await refusal(await redeem(h, runtime, token, "delete_file",
                                      {"path": "/srv/a.txt"})) == (409, "already_redeemed")


@pytest.fixture
def sh_factory(harness_factory: Callable[..., Any], tmp_path: Path) -> Callable[..., Any]:
    async def make(**kw: Any) -> Harness:
        h: Harness = await harness_factory(
            bundle_dirs=[write_scripted_bundle(tmp_path / "b")], **kw)
        return h
    return make


# --- K10 / K17: forged permits ------------------------------------------------------------


def _forge(token: str, *, header: dict[str, Any] | None = None,
           claims: dict[str, Any] | None = None, signature: bytes | None = None) -> str:
    h, p, s = token.split(".")
    head = b64(json.dumps(header).encode()) if header is not None else h
    body = b64(json.dumps(claims).encode()) if claims is not None else p
    sig = b64(signature) if signature is not None else s
    return f"{head}.{body}.{sig}"


async def test_k10_k17_forged_permits_are_refused(harness: Harness, tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    token = await approved_refund(harness, tenant, runtime)
    head_seg, body_seg, _ = token.split(".")
    header = json.loads(unb64(head_seg))
    claims = json.loads(unb64(body_seg))
    keyring: Keyring = harness.context.keyring
    public_x = unb64(keyring.jwks(now=datetime.now(UTC))["keys"][0]["x"])

    other = Keyring.ephemeral(now=datetime.now(UTC))
    by_other_key = other.sign(claims, typ=PERMIT_TYP)
    # Same claims signed by another key that claims our kid.
    other_key_our_kid = by_other_key.split(".")
    other_key_our_kid[0] = head_seg
    edited = dict(claims, args_hash="sha256:" + "0" * 64, tenant=tenant)
    signing_input = f"{b64(json.dumps({**header, 'alg': 'HS256'}).encode())}.{body_seg}"
    hs256 = signing_input + "." + b64(hmac.new(public_x, signing_input.encode(),
                                               hashlib.sha256).digest())
    cases = {
        "other key": (by_other_key, "unknown_kid"),
        "other key, our kid": (".".join(other_key_our_kid), "bad_signature"),
        "edited payload": (_forge(token, claims=edited), "bad_signature"),
        "alg none": (_forge(token, header={**header, "alg": "none"}, signature=b""),
                     "bad_signature"),
        "alg NONE": (_forge(token, header={**header, "alg": "NONE"}, signature=b""),
                     "bad_signature"),
        "HS256 with the public key": (hs256, "bad_signature"),
        "unknown kid": (_forge(token, header={**header, "kid": "A" * 43}), "unknown_kid"),
        "path kid": (_forge(token, header={**header, "kid": "../../dev/null"}), "unknown_kid"),
        "garbage": ("not.a.jws", "malformed_permit"),
    }
    for name, (forged, code) in cases.items():
        resp = await redeem(harness, runtime, forged, "issue_refund", refund_args())
        assert await refusal(resp) == (403, code), name
    # The genuine permit still works once: nothing above consumed it.
    assert (await redeem(harness, runtime, token, "issue_refund", refund_args())
            ).status_code == 200
    async with harness.db.read() as conn:
        refused = (await conn.execute(select(audit_events.c.type).where(
            audit_events.c.tenant == tenant,
            audit_events.c.type == "permit.refused"))).scalars().all()
    assert len(refused) == len(cases)


async def test_k10_permit_of_tenant_a_in_tenant_b(harness: Harness, tenant: str) -> None:
    runtime_a = await harness.headers(tenant, "runtime")
    decision = await decide(harness, runtime_a, decision_request(args=refund_args(5000)))
    runtime_b = await harness.headers(f"{tenant}-b", "runtime")
    assert await refusal(await redeem(harness, runtime_b, decision["permit"]["token"],
                                      "issue_refund", refund_args(5000))) == (
        403, "tenant_mismatch")
    assert (await redeem(harness, runtime_a, decision["permit"]["token"], "issue_refund",
                         refund_args(5000))).status_code == 200


async def test_redeem_needs_the_runtime_role_and_strict_body(harness: Harness,
                                                             tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    decision = await decide(harness, runtime, decision_request(args=refund_args(5000)))
    auditor = await harness.headers(tenant, "auditor")
    resp = await redeem(harness, auditor, decision["permit"]["token"], "issue_refund",
                        refund_args(5000))
    assert resp.status_code == 403
    resp = await harness.client.post("/v1/permits/redeem", headers=runtime, json={
        "permit": decision["permit"]["token"], "tool": "issue_refund",
        "args": refund_args(5000), "approved": True})
    assert resp.status_code == 422


# --- invariant 4: exactly one of many concurrent redeems wins -----------------------------


async def test_200_concurrent_redeems_yield_exactly_one_success(harness: Harness,
                                                                tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    decision = await decide(harness, runtime, decision_request(args=refund_args(5000)))
    token = decision["permit"]["token"]
    responses = list(await asyncio.gather(*(
        redeem(harness, runtime, token, "issue_refund", refund_args(5000))
        for _ in range(200))))
    # No 503 retried: the burst's reads are coalesced (cosigner.permits.redeem._Reads), so
    # none waits for a pooled connection of its own (tests/permits/test_redeem_reads.py).
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) == 1, statuses
    assert statuses.count(409) == 199, statuses
    assert {r.json()["code"] for r in responses if r.status_code == 409} == {
        "already_redeemed"}
    async with harness.db.read() as conn:
        types = (await conn.execute(select(audit_events.c.type).where(
            audit_events.c.tenant == tenant,
            audit_events.c.type.in_(["permit.redeemed", "permit.refused"])))).scalars().all()
    assert types.count("permit.redeemed") == 1 and types.count("permit.refused") == 199
