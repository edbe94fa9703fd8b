"""Approval requests and reviews over HTTP: separation of duties, quorum, expiry, cases
K09/K12/K13/K15/K18, long-poll, runtime-requested review."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.core.clock import FrozenClock
from cosigner.db.tables import audit_events
from tests.conftest import Harness, decision_request
from tests.http.approval_helpers import (
    FINANCE,
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


@pytest.fixture
async def sh(harness_factory: Callable[..., Any], tmp_path: Path) -> Harness:
    """A harness on the scripted bundle (policy result taken from ``context.result``)."""
    h: Harness = await harness_factory(bundle_dirs=[write_scripted_bundle(tmp_path / "b")])
    return h


async def event_types(h: Harness, tenant: str) -> list[str]:
    async with h.db.read() as conn:
        return list((await conn.execute(select(audit_events.c.type).where(
            audit_events.c.tenant == tenant).order_by(audit_events.c.seq))).scalars())


async def open_refund(h: Harness, tenant: str, runtime: dict[str, str],
                      amount: int = 150_000) -> dict[str, Any]:
    body = decision_request(run={"id": f"run-{uuid.uuid4().hex[:8]}"}, args=refund_args(amount))
    return await decide(h, runtime, body)


# --- the refund case ----------------------------------------------------------------------


async def test_refund_requires_finance_approval_then_permit_redeems_once(
        harness: Harness, tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime", subject="orchestrator")
    alice = await harness.headers(tenant, "finance", subject="alice")
    decision = await open_refund(harness, tenant, runtime)
    assert decision["effect"] == "require_approval" and decision["permit"] is None
    approval = decision["approval"]
    assert set(approval) == {"id", "status", "require", "progress", "distinct_from",
                             "expires_at", "review_url"}
    assert approval["status"] == "pending"
    assert approval["progress"] == [{"role": "finance", "count": 1, "approved": 0}]
    assert approval["review_url"].endswith(f"/ui/approvals/{approval['id']}")

    queue = (await harness.client.get("/v1/approvals", headers=alice)).json()["items"]
    assert [item["id"] for item in queue] == [approval["id"]]
    assert queue[0]["args"] == refund_args() and queue[0]["args_hash"] == decision["args_hash"]

    pending = await state(harness, runtime, approval["id"])
    assert pending["permit"] is None and pending["retry_after"] > 0  # K10: no permit yet

    resp = await review(harness, alice, approval["id"])
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "approved"
    assert resp.json()["permit"] is None  # the approver is not the executor
    done = await state(harness, runtime, approval["id"])
    assert done["status"] == "approved" and done["retry_after"] is None
    assert done["progress"] == [{"role": "finance", "count": 1, "approved": 1}]
    token = done["permit"]["token"]

    first = await redeem(harness, runtime, token, "issue_refund", refund_args())
    assert first.status_code == 200, first.text
    assert first.json()["approval_id"] == approval["id"]
    again = await redeem(harness, runtime, token, "issue_refund", refund_args())
    assert (again.status_code, again.json()["code"]) == (409, "already_redeemed")
    types = await event_types(harness, tenant)
    for expected in ("decision.made", "approval.requested", "approval.reviewed",
                     "approval.approved", "permit.minted", "permit.redeemed", "permit.refused"):
        assert expected in types


async def test_identical_retry_joins_the_pending_request(harness: Harness, tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    body = decision_request(args=refund_args())
    first = await decide(harness, runtime, body)
    second = await decide(harness, runtime, {**body, "request_id": "other-request"})
    assert second["decision_id"] != first["decision_id"]
    assert second["approval"]["id"] == first["approval"]["id"]
    types = await event_types(harness, tenant)
    assert types.count("approval.requested") == 1 and types.count("approval.joined") == 1


# --- review rules -------------------------------------------------------------------------


async def test_k13_requesting_runtime_cannot_approve_its_own_request(
        harness: Harness, tenant: str) -> None:
    both = await harness.headers(tenant, "runtime", "finance", subject="dual-use")
    decision = await open_refund(harness, tenant, both)
    resp = await review(harness, both, decision["approval"]["id"])
    assert (resp.status_code, resp.json()["code"]) == (403, "self_approval")


@pytest.mark.parametrize("who", ["agent-support", "customer-42"])
async def test_k13_initiator_or_principal_cannot_approve(harness: Harness, tenant: str,
                                                         who: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    decision = await open_refund(harness, tenant, runtime)
    same_person = await harness.headers(tenant, "finance", "admin", subject=who)
    resp = await review(harness, same_person, decision["approval"]["id"])
    assert (resp.status_code, resp.json()["code"]) == (403, "self_approval")


@pytest.mark.parametrize("field", ["requested_by", "approver", "subject", "roles"])
async def test_k13_identity_fields_in_the_body_are_rejected(harness: Harness, tenant: str,
                                                            field: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    decision = await open_refund(harness, tenant, runtime)
    alice = await harness.headers(tenant, "finance", subject="alice")
    resp = await review(harness, alice, decision["approval"]["id"], **{field: "bob"})
    assert (resp.status_code, resp.json()["code"]) == (422, "validation_failed")
    assert (await state(harness, runtime, decision["approval"]["id"]))["status"] == "pending"


async def test_k10_inlined_approval_in_a_decision_request_is_422(harness: Harness,
                                                                 tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    body = decision_request(args=refund_args(), approval={"status": "approved"})
    resp = await harness.client.post("/v1/decisions", headers=runtime, json=body)
    assert (resp.status_code, resp.json()["code"]) == (422, "validation_failed")


async def test_same_person_twice_counts_once(sh: Harness, tenant: str) -> None:
    runtime = await sh.headers(tenant, "runtime")
    decision = await decide(sh, runtime, scripted(needs(("finance", 2))))
    approval_id = decision["approval"]["id"]
    alice = await sh.headers(tenant, "finance", subject="alice")
    assert (await review(sh, alice, approval_id)).status_code == 200
    resp = await review(sh, alice, approval_id)
    assert (resp.status_code, resp.json()["code"]) == (409, "duplicate_review")
    # A second key of the same subject is the same person.
    alice_again = await sh.headers(tenant, "finance", subject="alice")
    resp = await review(sh, alice_again, approval_id)
    assert (resp.status_code, resp.json()["code"]) == (409, "duplicate_review")
    current = await state(sh, runtime, approval_id)
    assert current["status"] == "pending"
    assert current["progress"] == [{"role": "finance", "count": 2, "approved": 1}]


async def test_one_person_counts_once_across_groups(sh: Harness, tenant: str) -> None:
    runtime = await sh.headers(tenant, "runtime")
    decision = await decide(sh, runtime, scripted(needs(("finance", 1), ("security", 1))))
    approval_id = decision["approval"]["id"]
    alice = await sh.headers(tenant, "finance", "security", subject="alice")
    body = (await review(sh, alice, approval_id)).json()
    assert body["status"] == "pending"
    assert sum(g["approved"] for g in body["progress"]) == 1
    carol = await sh.headers(tenant, "security", subject="carol")
    # alice is re-counted for finance so carol fills security: two people, both groups met.
    bob = await sh.headers(tenant, "finance", subject="bob")
    body = (await review(sh, bob, approval_id)).json()
    assert body["status"] == "approved", body
    assert {(r["subject"], r["role"]) for r in body["reviews"]} == {
        ("alice", "security"), ("bob", "finance")}
    resp = await review(sh, carol, approval_id)
    assert (resp.status_code, resp.json()["code"]) == (409, "approval_not_pending")


async def test_person_needed_for_a_full_group_only_is_refused(sh: Harness,
                                                              tenant: str) -> None:
    runtime = await sh.headers(tenant, "runtime")
    decision = await decide(sh, runtime, scripted(needs(("finance", 1), ("security", 1))))
    approval_id = decision["approval"]["id"]
    assert (await review(sh, await sh.headers(tenant, "finance", subject="a"),
                         approval_id)).status_code == 200
    resp = await review(sh, await sh.headers(tenant, "finance", subject="b"), approval_id)
    assert (resp.status_code, resp.json()["code"]) == (409, "role_already_met")


async def test_ineligible_role_is_403(harness: Harness, tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    decision = await open_refund(harness, tenant, runtime)
    security = await harness.headers(tenant, "security", subject="sec")
    resp = await review(harness, security, decision["approval"]["id"])
    assert (resp.status_code, resp.json()["code"]) == (403, "not_eligible")


async def test_previous_approver_in_the_run_is_refused(sh: Harness, tenant: str) -> None:
    runtime = await sh.headers(tenant, "runtime")
    alice = await sh.headers(tenant, "finance", subject="alice")
    bob = await sh.headers(tenant, "finance", subject="bob")
    first = await decide(sh, runtime, scripted(needs(("finance", 1)), run="run-p",
                                               args={"path": "/a"}))
    assert (await review(sh, alice, first["approval"]["id"])).json()["status"] == "approved"
    second = await decide(sh, runtime, scripted(needs(("finance", 1)), run="run-p",
                                                args={"path": "/b"}))
    resp = await review(sh, alice, second["approval"]["id"])
    assert (resp.status_code, resp.json()["code"]) == (403, "previous_approver")
    assert (await review(sh, bob, second["approval"]["id"])).json()["status"] == "approved"


async def test_distinct_from_previous_only_lets_the_initiator_approve(
        sh: Harness, tenant: str) -> None:
    runtime = await sh.headers(tenant, "runtime")
    decision = await decide(sh, runtime, scripted(needs(("finance", 1),
                                                        distinct_from="previous")))
    initiator = await sh.headers(tenant, "finance", subject="agent-support")
    assert (await review(sh, initiator, decision["approval"]["id"])).status_code == 200


async def test_one_rejection_rejects_and_nothing_approves_after(sh: Harness,
                                                                tenant: str) -> None:
    runtime = await sh.headers(tenant, "runtime")
    decision = await decide(sh, runtime, scripted(needs(("finance", 2))))
    approval_id = decision["approval"]["id"]
    alice = await sh.headers(tenant, "finance", subject="alice")
    bob = await sh.headers(tenant, "finance", subject="bob")
    assert (await review(sh, alice, approval_id)).status_code == 200
    resp = await review(sh, bob, approval_id, "rejected", comment="")
    assert (resp.status_code, resp.json()["code"]) == (422, "comment_required")
    resp = await review(sh, bob, approval_id, "rejected", comment="not a duplicate charge")
    assert resp.json()["status"] == "rejected"
    carol = await sh.headers(tenant, "finance", subject="carol")
    resp = await review(sh, carol, approval_id)
    assert (resp.status_code, resp.json()["code"]) == (409, "approval_not_pending")
    resp = await sh.client.post(f"/v1/approvals/{approval_id}/cancel", headers=runtime)
    assert (resp.status_code, resp.json()["code"]) == (409, "approval_not_pending")
    assert (await state(sh, runtime, approval_id))["permit"] is None


async def test_every_review_attempt_is_logged(harness: Harness, tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime", "finance")
    decision = await open_refund(harness, tenant, runtime)
    approval_id = decision["approval"]["id"]
    await review(harness, runtime, approval_id)  # self
    await review(harness, await harness.headers(tenant, "security"), approval_id)
    await review(harness, await harness.headers(tenant, "finance"), f"{approval_id}x")
    async with harness.db.read() as conn:
        rows = (await conn.execute(select(audit_events.c.body).where(
            audit_events.c.tenant == tenant,
            audit_events.c.type == "approval.review_refused"))).scalars().all()
    codes = sorted(__import__("json").loads(b)["payload"]["code"] for b in rows)
    assert codes == ["not_eligible", "not_found", "self_approval"]


async def test_cancel_by_runtime(harness: Harness, tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    decision = await open_refund(harness, tenant, runtime)
    approval_id = decision["approval"]["id"]
    alice = await harness.headers(tenant, "finance", subject="alice")
    resp = await harness.client.post(f"/v1/approvals/{approval_id}/cancel", headers=alice)
    assert resp.status_code == 403
    resp = await harness.client.post(f"/v1/approvals/{approval_id}/cancel", headers=runtime)
    assert resp.json()["status"] == "cancelled"
    resp = await review(harness, alice, approval_id)
    assert (resp.status_code, resp.json()["code"]) == (409, "approval_not_pending")


# --- K15: empty requirement, anonymous, no role -------------------------------------------


@pytest.mark.parametrize("approval", [
    {"require": [], "timeout_ms": 1000},
    {"timeout_ms": 1000},
    {"require": [{"role": "finance", "count": 0}]},
    {"require": [{"role": "finance", "count": 1}], "timeout_ms": 0},
    {"require": [{"role": "finance", "count": 1}], "timeout_ms": 2_592_000_001},
])
async def test_k15_empty_or_invalid_requirement_is_a_policy_error_deny(
        sh: Harness, tenant: str, approval: dict[str, Any]) -> None:
    runtime = await sh.headers(tenant, "runtime")
    decision = await decide(sh, runtime, scripted({"effect": "require_approval",
                                                   "approval": approval}))
    assert decision["effect"] == "deny" and decision["approval"] is None
    assert decision["reasons"][0]["code"] == "policy_error"
    async with sh.db.read() as conn:
        from cosigner.db.tables_approvals import approvals

        assert (await conn.execute(select(approvals.c.id).where(
            approvals.c.tenant == tenant))).first() is None


async def test_k15_anonymous_review_is_401_and_roleless_is_403(harness: Harness,
                                                               tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    approval_id = (await open_refund(harness, tenant, runtime))["approval"]["id"]
    resp = await harness.client.post(f"/v1/approvals/{approval_id}/reviews",
                                      json={"decision": "approved"})
    assert resp.status_code == 401
    for roles in (("runtime",), ("auditor",), ("admin",)):
        resp = await review(harness, await harness.headers(tenant, *roles), approval_id)
        assert (resp.status_code, resp.json()["code"]) == (403, "not_eligible")


# --- K18 / K12: expiry --------------------------------------------------------------------


async def test_k18_approve_at_exactly_expires_at_is_409_expired(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    clock = FrozenClock(T0)
    h: Harness = await harness_factory(clock=clock,
                                       bundle_dirs=[write_scripted_bundle(tmp_path / "b")])
    runtime = await h.headers(tenant, "runtime")
    alice = await h.headers(tenant, "finance", subject="alice")
    early = await decide(h, runtime, scripted(needs(("finance", 1), timeout_ms=60_000)))
    on_time = await decide(h, runtime, scripted(needs(("finance", 1), timeout_ms=60_000)))
    clock.advance(seconds=60, microseconds=-1)
    assert (await review(h, alice, early["approval"]["id"])).json()["status"] == "approved"
    clock.advance(microseconds=1)  # now == expires_at: expiry wins
    resp = await review(h, alice, on_time["approval"]["id"])
    assert (resp.status_code, resp.json()["code"]) == (409, "approval_expired")
    current = await state(h, runtime, on_time["approval"]["id"])
    assert current["status"] == "expired" and current["permit"] is None
    types = await event_types(h, tenant)
    assert types.count("approval.expired") == 1
    resp = await review(h, alice, on_time["approval"]["id"])
    assert (resp.status_code, resp.json()["code"]) == (409, "approval_expired")


async def test_k12_expired_request_reads_expired_and_a_retry_opens_a_new_one(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    clock = FrozenClock(T0)
    h: Harness = await harness_factory(clock=clock,
                                       bundle_dirs=[write_scripted_bundle(tmp_path / "b")])
    runtime = await h.headers(tenant, "runtime")
    body = scripted(needs(("finance", 1), timeout_ms=1_000))
    first = await decide(h, runtime, body)
    clock.advance(seconds=1)
    assert (await state(h, runtime, first["approval"]["id"], wait=0))["status"] == "expired"
    second = await decide(h, runtime, {**body, "request_id": "retry"})
    assert second["approval"]["id"] != first["approval"]["id"]
    assert second["approval"]["status"] == "pending"


# --- reads --------------------------------------------------------------------------------


async def test_long_poll_returns_when_the_request_is_decided(harness: Harness,
                                                             tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    alice = await harness.headers(tenant, "finance", subject="alice")
    approval_id = (await open_refund(harness, tenant, runtime))["approval"]["id"]

    async def approve_soon() -> None:
        await asyncio.sleep(0.3)
        await review(harness, alice, approval_id)

    started = asyncio.get_running_loop().time()
    waited, _ = await asyncio.gather(state(harness, runtime, approval_id, wait=60),
                                     approve_soon())
    assert waited["status"] == "approved" and waited["permit"] is not None
    # Woken by the review, not by the 60 s wait's end (a margin for a loaded machine).
    assert asyncio.get_running_loop().time() - started < 30
    pending = await open_refund(harness, tenant, runtime)
    quick = await state(harness, runtime, pending["approval"]["id"], wait=0.3)
    assert quick["status"] == "pending" and quick["retry_after"] > 0


@pytest.mark.parametrize("wait", ["61", "-1", "soon"])
async def test_wait_is_bounded(harness: Harness, tenant: str, wait: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    approval_id = (await open_refund(harness, tenant, runtime))["approval"]["id"]
    resp = await harness.client.get(f"/v1/approvals/{approval_id}", headers=runtime,
                                    params={"wait": wait})
    assert resp.status_code == 422


async def test_other_tenants_see_nothing(harness: Harness, tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    approval_id = (await open_refund(harness, tenant, runtime))["approval"]["id"]
    other = f"{tenant}-other"
    for headers in (await harness.headers(other, "runtime"),
                    await harness.headers(other, "finance")):
        resp = await harness.client.get(f"/v1/approvals/{approval_id}", headers=headers)
        assert (resp.status_code, resp.json()["code"]) == (404, "not_found")
        resp = await review(harness, headers, approval_id)
        assert resp.status_code == 404
        listed = await harness.client.get("/v1/approvals", headers=headers)
        assert listed.json()["items"] == []
    assert (await state(harness, runtime, approval_id))["status"] == "pending"


async def test_queue_lists_only_what_the_approver_may_review(harness: Harness,
                                                             tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    approval_id = (await open_refund(harness, tenant, runtime))["approval"]["id"]
    initiator = await harness.headers(tenant, "finance", subject="agent-support")
    security = await harness.headers(tenant, "security")
    for headers in (initiator, security):
        assert (await harness.client.get("/v1/approvals", headers=headers)
                ).json()["items"] == []
    alice = await harness.headers(tenant, "finance", subject="alice")
    assert [i["id"] for i in (await harness.client.get(
        "/v1/approvals", headers=alice)).json()["items"]] == [approval_id]
    resp = await harness.client.get(f"/v1/approvals/{approval_id}", headers=security)
    assert resp.status_code == 403


async def test_masked_paths_never_shown(sh: Harness, tenant: str) -> None:
    runtime = await sh.headers(tenant, "runtime")
    result = {**needs(("finance", 1)), "mask": ["/card/number", "/missing"]}
    args = {"path": "/a", "card": {"number": "4111111111111111", "exp": "12/30"}}
    decision = await decide(sh, runtime, scripted(result, args=args))
    alice = await sh.headers(tenant, "finance", subject="alice")
    shown = await state(sh, alice, decision["approval"]["id"])
    assert shown["args"] == {"path": "/a", "card": {"number": "•••", "exp": "12/30"}}
    async with sh.db.read() as conn:
        bodies = (await conn.execute(select(audit_events.c.body).where(
            audit_events.c.tenant == tenant))).scalars().all()
    assert not any("4111111111111111" in body for body in bodies)


# --- runtime-requested review -------------------------------------------------------------


async def test_runtime_review_withholds_the_permit_until_approved(harness: Harness,
                                                                  tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    alice = await harness.headers(tenant, "finance", subject="alice")
    decision = await decide(harness, runtime, decision_request(args=refund_args(5000)))
    assert decision["effect"] == "allow"
    resp = await harness.client.post("/v1/approvals", headers=runtime, json={
        "decision_id": decision["decision_id"], "reason": "customer sounded unusual"})
    assert resp.status_code == 200, resp.text
    asked = resp.json()
    assert asked["kind"] == "runtime_review" and asked["require"] == FINANCE["require"]
    again = await harness.client.post("/v1/approvals", headers=runtime, json={
        "decision_id": decision["decision_id"], "reason": "again"})
    assert again.json()["id"] == asked["id"]
    old = await redeem(harness, runtime, decision["permit"]["token"], "issue_refund",
                       refund_args(5000))
    assert (old.status_code, old.json()["code"]) == (409, "revoked")
    assert (await review(harness, alice, asked["id"])).json()["status"] == "approved"
    token = (await state(harness, runtime, asked["id"]))["permit"]["token"]
    resp = await redeem(harness, runtime, token, "issue_refund", refund_args(5000))
    assert resp.status_code == 200, resp.text


async def test_runtime_review_needs_a_bundle_requirement(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    h: Harness = await harness_factory(
        bundle_dirs=[write_scripted_bundle(tmp_path / "b", review=False)])
    runtime = await h.headers(tenant, "runtime")
    decision = await decide(h, runtime, scripted({"effect": "allow"}))
    resp = await h.client.post("/v1/approvals", headers=runtime, json={
        "decision_id": decision["decision_id"], "reason": "unsure"})
    assert (resp.status_code, resp.json()["code"]) == (422, "no_review_requirement")
    ok = await redeem(h, runtime, decision["permit"]["token"], "delete_file",
                      {"path": "/tmp/a"})
    assert ok.status_code == 200  # nothing was withheld


async def test_runtime_review_of_deny_or_unknown_decision(harness: Harness,
                                                          tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    denied = await decide(harness, runtime, decision_request(args=refund_args(250_000)))
    resp = await harness.client.post("/v1/approvals", headers=runtime, json={
        "decision_id": denied["decision_id"], "reason": "x"})
    assert (resp.status_code, resp.json()["code"]) == (422, "not_an_allow_decision")
    resp = await harness.client.post("/v1/approvals", headers=runtime, json={
        "decision_id": str(uuid.uuid4()), "reason": "x"})
    assert resp.status_code == 404
