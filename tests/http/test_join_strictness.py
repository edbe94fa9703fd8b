"""A pending-approval join never weakens what the current policy requires (session 14).

A ``require_approval`` decision of a call (tenant, run, tool, args hash) with a pending
request joins it only when that request asks at least what the decision's requirement asks
(:func:`cosigner.approvals.superseding.covers`): every group with at least the count (and
signed where asked), at least the ``distinct_from`` rules, the step-up, no longer a stage,
no weaker escalation, break-glass or standing. An equal or weaker requirement joins as
before (on SQLite on the raw driver, ``join_raw``). A stricter one (in any respect)
supersedes the twin: it is cancelled (``approval.superseded``, its reviews voided: they
count for nothing toward the new request, not even as a ``previous`` approval) and a new
request opens with the decision's own requirement, on which the permit is then minted.

The policy is scripted per decision (``context.result``), so a second decision of the same
call stands for the bundle changed in between.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.core.clock import FrozenClock
from cosigner.db.tables import audit_events
from cosigner.db.tables_approvals import reviews
from tests.conftest import Harness
from tests.http.approval_helpers import (
    decide,
    needs,
    review,
    scripted,
    scripted_harness,
    state,
)
from tests.http.raw_rows import chain_holds
from tests.http.test_approval_escalation import escalating
from tests.http.test_raw_join import Ways

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def clocked(harness_factory: Callable[..., Any], tmp_path: Path
                  ) -> tuple[Harness, FrozenClock]:
    clock = FrozenClock(T0)
    return await scripted_harness(harness_factory, tmp_path, clock=clock), clock


async def _events(h: Harness, tenant: str, *types: str) -> list[dict[str, Any]]:
    async with h.db.read() as conn:
        rows = (await conn.execute(select(audit_events.c.type, audit_events.c.body).where(
            audit_events.c.tenant == tenant).order_by(audit_events.c.seq))).all()
    return [{"type": r.type, **json.loads(r.body)} for r in rows
            if not types or r.type in types]


def _with(result: dict[str, Any], **approval: Any) -> dict[str, Any]:
    return {**result, "approval": {**result["approval"], **approval}}


async def _again(h: Harness, runtime: dict[str, str], body: dict[str, Any],
                 result: dict[str, Any], request_id: str) -> dict[str, Any]:
    """The same call decided again, the policy now answering ``result``."""
    return await decide(h, runtime, {**body, "request_id": request_id,
                                     "context": {"result": result}})


async def _permit_approvers(h: Harness, runtime: dict[str, str],
                            approval_id: str) -> list[tuple[str, str]]:
    done = await state(h, runtime, approval_id)
    assert done["status"] == "approved", done
    token = done["permit"]["token"]
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return sorted((a["id"], a["role"]) for a in claims["approvers"])


# --- stricter: superseded ------------------------------------------------------------------


async def test_a_higher_count_supersedes_the_twin_and_the_permit_needs_it(
        clocked: tuple[Harness, FrozenClock], tenant: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    h, _ = clocked
    runtime = await h.headers(tenant, "runtime")
    fin = {s: await h.headers(tenant, "finance", subject=s) for s in ("carol", "dave", "erin")}
    ways = Ways(monkeypatch)
    body = scripted(needs(("finance", 2)))
    first = await decide(h, runtime, body)
    old = first["approval"]["id"]
    assert (await review(h, fin["carol"], old)).status_code == 200  # 1 of 2
    ways.take()
    second = await _again(h, runtime, body, needs(("finance", 3)), "stricter-count")
    new = second["approval"]["id"]
    # The raw join sees the stricter requirement and hands it back (PostgreSQL: core).
    assert ways.take() == (["join_raw", "core"] if h.db.is_sqlite else ["core"])
    assert new != old
    assert second["approval"]["require"] == [{"role": "finance", "count": 3}]
    assert second["approval"]["progress"] == [{"role": "finance", "count": 3, "approved": 0}]
    assert (await state(h, runtime, old))["status"] == "cancelled"
    # The twin is closed to reviews (terminal states never change).
    late = await review(h, fin["dave"], old)
    assert (late.status_code, late.json()["code"]) == (409, "approval_not_pending")
    # The decision's events, chained: the twin superseded, then the new request.
    types = [e["type"] for e in await _events(h, tenant)]
    assert types[-4:] == ["decision.made", "approval.superseded", "approval.requested",
                          "approval.review_refused"]
    superseded = (await _events(h, tenant, "approval.superseded"))[0]
    assert superseded["subject"]["approval_id"] == old
    assert superseded["payload"]["superseded_by"] == new
    assert superseded["payload"]["decision_id"] == second["decision_id"]
    assert superseded["payload"]["reason"] == "requirement_raised"
    assert superseded["payload"]["voided"] == [{"subject": "carol", "role": "finance",
                                                "stage": 1}]
    # Carol's review of the twin counts for nothing now, not even as a previous approval
    # toward the new request of the same call (initiator_and_previous): she approves it
    # again (toward the run's other calls it counts: tests/http/test_previous_approvers.py).
    for subject in ("carol", "dave"):
        resp = await review(h, fin[subject], new)
        assert resp.status_code == 200, resp.text
        assert resp.json()["status"] == "pending"
    resp = await review(h, fin["erin"], new)
    assert resp.status_code == 200 and resp.json()["status"] == "approved", resp.text
    assert await _permit_approvers(h, runtime, new) == [
        ("carol", "finance"), ("dave", "finance"), ("erin", "finance")]
    await chain_holds(h, tenant)


async def test_an_added_role_group_supersedes_and_both_groups_sign_the_permit(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, _ = clocked
    runtime = await h.headers(tenant, "runtime")
    carol = await h.headers(tenant, "finance", subject="carol")
    sam = await h.headers(tenant, "security", subject="sam")
    body = scripted(needs(("finance", 1)))
    old = (await decide(h, runtime, body))["approval"]["id"]
    second = await _again(h, runtime, body, needs(("finance", 1), ("security", 1)), "plus")
    new = second["approval"]["id"]
    assert new != old
    assert second["approval"]["require"] == [{"role": "finance", "count": 1},
                                             {"role": "security", "count": 1}]
    # Carol alone approved the twin; on the new request she is one of two.
    resp = await review(h, carol, new)
    assert resp.status_code == 200 and resp.json()["status"] == "pending", resp.text
    resp = await review(h, sam, new)
    assert resp.status_code == 200 and resp.json()["status"] == "approved", resp.text
    assert await _permit_approvers(h, runtime, new) == [("carol", "finance"),
                                                        ("sam", "security")]
    await chain_holds(h, tenant)


async def test_a_stricter_distinct_from_supersedes_and_refuses_the_initiator(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, _ = clocked
    runtime = await h.headers(tenant, "runtime")
    # The call's initiator holds finance: distinct_from "previous" lets them approve.
    initiator = await h.headers(tenant, "finance", subject="agent-support")
    body = scripted(needs(("finance", 1), distinct_from="previous"))
    old = (await decide(h, runtime, body))["approval"]["id"]
    second = await _again(h, runtime, body, needs(("finance", 1)), "stricter-distinct")
    new = second["approval"]["id"]
    assert new != old and second["approval"]["distinct_from"] == "initiator_and_previous"
    resp = await review(h, initiator, new)
    assert (resp.status_code, resp.json()["code"]) == (403, "self_approval")
    assert (await state(h, runtime, new))["status"] == "pending"
    await chain_holds(h, tenant)


async def test_a_step_up_supersedes_and_an_api_key_cannot_approve(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, _ = clocked
    runtime = await h.headers(tenant, "runtime")
    carol = await h.headers(tenant, "finance", subject="carol")
    body = scripted(needs(("finance", 1)))
    old = (await decide(h, runtime, body))["approval"]["id"]
    second = await _again(h, runtime, body, _with(needs(("finance", 1)), assurance="mfa"),
                          "step-up")
    new = second["approval"]["id"]
    assert new != old
    assert (await state(h, runtime, new))["step_up"]["assurance"] == "mfa"
    resp = await review(h, carol, new)
    assert (resp.status_code, resp.json()["code"]) == (403, "step_up_required")
    await chain_holds(h, tenant)


async def test_a_shorter_timeout_supersedes_with_the_earlier_expiry(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    body = scripted(needs(("finance", 1), timeout_ms=600_000))
    old = (await decide(h, runtime, body))["approval"]
    clock.advance(seconds=10)
    second = await _again(h, runtime, body, needs(("finance", 1), timeout_ms=60_000), "short")
    assert second["approval"]["id"] != old["id"]
    expires = datetime.fromisoformat(second["approval"]["expires_at"].replace("Z", "+00:00"))
    assert expires == clock() + timedelta(seconds=60)
    await chain_holds(h, tenant)


async def test_an_escalated_twin_the_new_policy_has_no_stage_for_is_superseded(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    """At its second stage a manager may approve the twin; the new policy has no such
    stage (finance only), so joining would let a manager authorise the call."""
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    body = scripted(escalating(finance=1))  # finance (60 s), then manager (60 s)
    old = (await decide(h, runtime, body))["approval"]["id"]
    clock.advance(seconds=60)
    second = await _again(h, runtime, body, needs(("finance", 1), distinct_from="initiator"),
                          "no-second-stage")
    assert second["approval"]["id"] != old
    assert second["approval"]["require"] == [{"role": "finance", "count": 1}]
    types = [e["type"] for e in await _events(h, tenant)]
    assert types[-4:] == ["decision.made", "approval.escalated", "approval.superseded",
                          "approval.requested"]
    await chain_holds(h, tenant)


async def test_stricter_in_one_respect_weaker_in_another_takes_the_new_requirement(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, _ = clocked
    runtime = await h.headers(tenant, "runtime")
    body = scripted(needs(("finance", 2)))
    old = (await decide(h, runtime, body))["approval"]["id"]
    # Fewer finance approvers but a security one: not implied by the twin's.
    second = await _again(h, runtime, body, needs(("finance", 1), ("security", 1)), "mixed")
    assert second["approval"]["id"] != old
    assert second["approval"]["require"] == [{"role": "finance", "count": 1},
                                             {"role": "security", "count": 1}]
    await chain_holds(h, tenant)


# --- equal or weaker: joined, on the raw path ---------------------------------------------


@pytest.mark.parametrize("result", [
    needs(("finance", 2)),  # equal
    needs(("finance", 1)),  # a lower count
    needs(("finance", 2), distinct_from="initiator"),  # a weaker distinct_from
    needs(("finance", 2), timeout_ms=1_200_000),  # a longer timeout
], ids=["equal", "lower_count", "weaker_distinct_from", "longer_timeout"])
async def test_an_equal_or_weaker_requirement_joins_on_the_raw_path(
        clocked: tuple[Harness, FrozenClock], tenant: str,
        monkeypatch: pytest.MonkeyPatch, result: dict[str, Any]) -> None:
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    carol = await h.headers(tenant, "finance", subject="carol")
    ways = Ways(monkeypatch)
    body = scripted(needs(("finance", 2)))
    first = await decide(h, runtime, body)
    assert (await review(h, carol, first["approval"]["id"])).status_code == 200
    clock.advance(seconds=5)
    ways.take()
    joined = await _again(h, runtime, body, result, "retry")
    assert ways.take() == (["join_raw"] if h.db.is_sqlite else ["core"])
    assert joined["approval"] == {**first["approval"], "progress": [
        {"role": "finance", "count": 2, "approved": 1}]}  # the twin's, carol's counted
    types = [e["type"] for e in await _events(h, tenant)]
    assert types[-2:] == ["decision.made", "approval.joined"]
    assert "approval.superseded" not in types
    await chain_holds(h, tenant)


async def test_an_escalated_twin_is_still_joined_by_the_same_policy(
        clocked: tuple[Harness, FrozenClock], tenant: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    ways = Ways(monkeypatch)
    body = scripted(escalating(finance=1))
    first = await decide(h, runtime, body)
    clock.advance(seconds=60)
    await state(h, runtime, first["approval"]["id"])  # escalated on read
    ways.take()
    joined = await _again(h, runtime, body, escalating(finance=1), "at-stage-2")
    assert ways.take() == (["join_raw"] if h.db.is_sqlite else ["core"])
    assert joined["approval"]["id"] == first["approval"]["id"]


async def test_an_escalated_twin_that_escalated_sooner_than_the_new_policy_is_superseded(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    """The twin's first stage lasted 60 s; the new policy gives finance 10 min before a
    manager may step in, so the twin's manager stage came too early for it."""
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    body = scripted(escalating(finance=1))
    old = (await decide(h, runtime, body))["approval"]["id"]
    clock.advance(seconds=60)
    await state(h, runtime, old)  # escalated on read
    longer = escalating(finance=1)
    longer["approval"]["timeout_ms"] = 600_000
    second = await _again(h, runtime, body, longer, "longer-first-stage")
    assert second["approval"]["id"] != old
    assert second["approval"]["require"] == [{"role": "finance", "count": 1}]


# --- the other openers: runtime review and program barriers -------------------------------


async def test_a_runtime_review_stricter_than_the_pending_twin_supersedes_it(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, _ = clocked
    runtime = await h.headers(tenant, "runtime")
    body = scripted(needs(("finance", 1), distinct_from="previous"), run="run-review")
    old = (await decide(h, runtime, body))["approval"]["id"]
    allowed = await _again(h, runtime, body, {"effect": "allow"}, "now-allowed")
    # The bundle's [review]: finance x1, initiator_and_previous (stricter than "previous").
    resp = await h.client.post("/v1/approvals", headers=runtime, json={
        "decision_id": allowed["decision_id"], "reason": "looks odd"})
    assert resp.status_code == 200, resp.text
    opened = resp.json()
    assert opened["id"] != old and opened["kind"] == "runtime_review"
    assert opened["distinct_from"] == "initiator_and_previous"
    assert (await state(h, runtime, old))["status"] == "cancelled"
    await chain_holds(h, tenant)


async def test_a_runtime_review_no_stricter_than_the_pending_twin_joins_it(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, _ = clocked
    runtime = await h.headers(tenant, "runtime")
    body = scripted(needs(("finance", 2)), run="run-review-join")
    old = (await decide(h, runtime, body))["approval"]["id"]
    allowed = await _again(h, runtime, body, {"effect": "allow"}, "now-allowed")
    resp = await h.client.post("/v1/approvals", headers=runtime, json={
        "decision_id": allowed["decision_id"], "reason": "looks odd"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["id"] == old


async def test_a_stricter_barrier_retry_supersedes_and_an_equal_one_joins(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    # The bundle allows every barrier, so the program's own requirement is the barrier's.
    folder = tmp_path / "b" / "join-barriers"
    folder.mkdir(parents=True)
    (folder / "manifest.toml").write_text(
        'id = "join-barriers"\nversion = "1"\nengine = "python"\nentrypoint = "decide"\n'
        'tenants = ["*"]\n')
    (folder / "rules.py").write_text('def decide(input):\n    return {"effect": "allow"}\n')
    h: Harness = await harness_factory(bundle_dirs=[tmp_path / "b"])
    program = await h.headers(tenant, "runtime", "barrier", subject="deploy-bot")
    ask = {"run": {"id": "run-barrier"}, "context": {"kind": "deploy"},
           "require": [{"role": "finance", "count": 1}], "timeout_ms": 600_000,
           "distinct_from": "initiator"}

    async def barrier(**changes: Any) -> dict[str, Any]:
        resp = await h.client.post("/v1/approvals", headers=program, json={**ask, **changes})
        assert resp.status_code == 200, resp.text
        data: dict[str, Any] = resp.json()
        return data

    first = await barrier()
    assert (await barrier())["id"] == first["id"]  # equal: joined
    raised = await barrier(require=[{"role": "finance", "count": 2}])
    assert raised["id"] != first["id"]
    assert raised["require"] == [{"role": "finance", "count": 2}]
    assert (await state(h, program, first["id"]))["status"] == "cancelled"
    lower = await barrier()
    assert lower["id"] == raised["id"]  # weaker again: joins the raised one
    await chain_holds(h, tenant)


async def test_voided_reviews_keep_their_record(clocked: tuple[Harness, FrozenClock],
                                                tenant: str) -> None:
    """The superseded request still lists who reviewed it; their rows count for no group."""
    h, _ = clocked
    runtime = await h.headers(tenant, "runtime")
    carol = await h.headers(tenant, "finance", subject="carol")
    body = scripted(needs(("finance", 2)))
    old = (await decide(h, runtime, body))["approval"]["id"]
    assert (await review(h, carol, old)).status_code == 200
    await _again(h, runtime, body, needs(("finance", 3)), "stricter")
    shown = await state(h, runtime, old)
    assert [(r["subject"], r["decision"], r["role"]) for r in shown["reviews"]] == [
        ("carol", "approved", None)]
    async with h.db.read() as conn:
        roles = (await conn.execute(select(reviews.c.role).where(
            reviews.c.approval_id == old))).scalars().all()
    assert roles == [None]


async def test_stricter_decisions_on_two_replicas_supersede_the_twin_once(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    """Two replicas (two apps, one database) decide the stricter call at once: one of them
    supersedes the twin, every other decision joins the request it opened (PostgreSQL: the
    twin's row lock and the partial unique index; SQLite: one writer)."""
    replicas = [await scripted_harness(harness_factory, tmp_path / f"r{i}",
                                       log_batch_wait_ms=20) for i in range(2)]
    runtime = await replicas[0].headers(tenant, "runtime")
    body = scripted(needs(("finance", 1)), run="run-race")
    old = (await decide(replicas[0], runtime, body))["approval"]["id"]
    answers = await asyncio.gather(*(
        _again(replicas[i % 2], runtime, body, needs(("finance", 2)), f"race-{i}")
        for i in range(8)))
    ids = {a["approval"]["id"] for a in answers}
    assert len(ids) == 1 and old not in ids
    events = await _events(replicas[0], tenant, "approval.superseded", "approval.requested",
                           "approval.joined")
    assert [e["type"] for e in events].count("approval.superseded") == 1
    assert [e["type"] for e in events].count("approval.requested") == 2  # the twin's, the new
    assert [e["type"] for e in events].count("approval.joined") == 7
    await chain_holds(replicas[0], tenant)


# --- the parties: another initiator or principal never joins ------------------------------


async def test_an_approver_proposing_the_same_call_supersedes_and_cannot_approve_it(
        clocked: tuple[Harness, FrozenClock], tenant: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Carol (finance) proposes the very call an agent's pending request holds. Joined, the
    request would compare its approvers with the agent only, and Carol could approve her
    own call. The twin is superseded (``other_party``) and the new request is Carol's:
    she is refused as its initiator; another approver's review mints the permit."""
    h, _ = clocked
    runtime = await h.headers(tenant, "runtime")
    carol = await h.headers(tenant, "finance", subject="carol")
    dave = await h.headers(tenant, "finance", subject="dave")
    ways = Ways(monkeypatch)
    body = scripted(needs(("finance", 1)))
    old = (await decide(h, runtime, body))["approval"]["id"]
    ways.take()
    mine = await decide(h, runtime, {**body, "request_id": "carol-proposes",
                                     "initiator": {"id": "carol", "type": "user"}})
    assert ways.take() == (["join_raw", "core"] if h.db.is_sqlite else ["core"])
    new = mine["approval"]["id"]
    assert new != old and (await state(h, runtime, old))["status"] == "cancelled"
    superseded = (await _events(h, tenant, "approval.superseded"))[0]
    assert superseded["payload"]["reason"] == "other_party"
    refused = await review(h, carol, new)
    assert (refused.status_code, refused.json()["code"]) == (403, "self_approval")
    # The same parties again: joins (on SQLite on the raw path), nothing superseded.
    ways.take()
    again = await decide(h, runtime, {**body, "request_id": "carol-again",
                                      "initiator": {"id": "carol", "type": "user"}})
    assert again["approval"]["id"] == new
    assert ways.take() == (["join_raw"] if h.db.is_sqlite else ["core"])
    assert (await review(h, dave, new)).status_code == 200
    assert await _permit_approvers(h, runtime, new) == [("dave", "finance")]
    await chain_holds(h, tenant)


async def test_another_principal_supersedes(clocked: tuple[Harness, FrozenClock],
                                            tenant: str) -> None:
    h, _ = clocked
    runtime = await h.headers(tenant, "runtime")
    body = scripted(needs(("finance", 1)))
    old = (await decide(h, runtime, body))["approval"]["id"]
    other = await decide(h, runtime, {**body, "request_id": "other-principal",
                                      "principal": {"id": "customer-7", "type": "customer"}})
    assert other["approval"]["id"] != old
    assert (await _events(h, tenant, "approval.superseded"))[0]["payload"]["reason"] == \
        "other_party"
    await chain_holds(h, tenant)
