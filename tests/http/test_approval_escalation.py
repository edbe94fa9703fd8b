"""Escalation on expiry (issue 18): a requirement's ``on_expired`` stage replaces expiry at
the exact instant a stage ends; earlier reviews stay shown, never counted again; the last
stage expires (cases K18, K13)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.approvals.requests import expire_due
from cosigner.core.clock import FrozenClock, isoformat
from cosigner.db.tables import audit_events
from tests.conftest import Harness
from tests.http.approval_helpers import (
    decide,
    redeem,
    review,
    scripted,
    scripted_harness,
    state,
)

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def escalating(*, finance: int = 1, stages: int = 2) -> dict[str, Any]:
    """finance (60 s) → manager (60 s) [→ director (60 s)]."""
    chain: dict[str, Any] | None = None
    for role in reversed(["finance", "manager", "director"][:stages]):
        stage: dict[str, Any] = {"require": [{"role": role,
                                              "count": finance if role == "finance" else 1}],
                                 "timeout_ms": 60_000, "distinct_from": "initiator"}
        if chain is not None:
            stage["on_expired"] = chain
        chain = stage
    return {"effect": "require_approval", "reasons": ["scripted"], "approval": chain}


@pytest.fixture
async def clocked(harness_factory: Callable[..., Any], tmp_path: Path
                  ) -> tuple[Harness, FrozenClock]:
    clock = FrozenClock(T0)
    return await scripted_harness(harness_factory, tmp_path, clock=clock), clock


async def event_types(h: Harness, tenant: str) -> list[str]:
    async with h.db.read() as conn:
        return list((await conn.execute(select(audit_events.c.type).where(
            audit_events.c.tenant == tenant).order_by(audit_events.c.seq))).scalars())


async def test_escalates_at_the_exact_instant_and_is_approved_at_stage_2(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    alice = await h.headers(tenant, "finance", subject="alice")
    carol = await h.headers(tenant, "finance", subject="carol")
    bob = await h.headers(tenant, "manager", subject="bob")
    body = scripted(escalating(finance=2))
    approval_id = (await decide(h, runtime, body))["approval"]["id"]
    assert (await review(h, carol, approval_id)).status_code == 200  # 1 of 2 at stage 1
    clock.advance(seconds=60, microseconds=-1)
    assert (await state(h, runtime, approval_id))["stage"] == 1
    assert (await review(h, bob, approval_id)).json()["code"] == "not_eligible"  # not yet
    clock.advance(microseconds=1)  # now == stage 1's expires_at: the stage is over
    resp = await review(h, alice, approval_id)  # would have met stage 1 a moment earlier
    assert (resp.status_code, resp.json()["code"]) == (403, "not_eligible")
    current = await state(h, runtime, approval_id)
    assert current["status"] == "pending" and current["stage"] == 2
    assert current["require"] == [{"role": "manager", "count": 1}]
    assert current["progress"] == [{"role": "manager", "count": 1, "approved": 0}]
    assert current["expires_at"] == isoformat(T0 + timedelta(seconds=120))
    assert [(r["subject"], r["stage"]) for r in current["reviews"]] == [("carol", 1)]
    clock.advance(seconds=59)
    approved = (await review(h, bob, approval_id)).json()
    assert approved["status"] == "approved" and approved["stage"] == 2
    assert [(r["subject"], r["stage"]) for r in approved["reviews"]] == [
        ("carol", 1), ("bob", 2)]
    permit = (await state(h, runtime, approval_id))["permit"]
    assert [a["id"] for a in _claims(permit["token"])["approvers"]] == ["bob"]
    ok = await redeem(h, runtime, permit["token"], "delete_file", body["args"])
    assert ok.status_code == 200, ok.text
    types = await event_types(h, tenant)
    assert types.count("approval.escalated") == 1 and "approval.expired" not in types


def _claims(token: str) -> dict[str, Any]:
    import base64
    import json

    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


async def test_expires_after_the_last_stage_and_never_revives(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    dan = await h.headers(tenant, "director", subject="dan")
    approval_id = (await decide(h, runtime, scripted(escalating(stages=3))))["approval"]["id"]
    clock.advance(seconds=180)  # noticed late: every stage ended, each at its own instant
    current = await state(h, runtime, approval_id)
    assert current["status"] == "expired" and current["stage"] == 3
    resp = await review(h, dan, approval_id)
    assert (resp.status_code, resp.json()["code"]) == (409, "approval_expired")
    types = await event_types(h, tenant)
    assert types.count("approval.escalated") == 2 and types.count("approval.expired") == 1


async def test_the_sweep_escalates_and_the_new_approvers_see_it(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    bob = await h.headers(tenant, "manager", subject="bob")
    approval_id = (await decide(h, runtime, scripted(escalating())))["approval"]["id"]
    resp = await h.client.get("/v1/approvals", headers=bob)
    assert approval_id not in [i["id"] for i in resp.json()["items"]]
    clock.advance(seconds=60)
    assert await expire_due(h.db, clock(), settings=h.settings, tenant=tenant) == 1
    assert await expire_due(h.db, clock(), settings=h.settings, tenant=tenant) == 0
    resp = await h.client.get("/v1/approvals", headers=bob)
    assert approval_id in [i["id"] for i in resp.json()["items"]]
    assert (await event_types(h, tenant)).count("approval.escalated") == 1


async def test_a_retry_joins_the_escalated_request(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    body = scripted(escalating())
    first = await decide(h, runtime, body)
    clock.advance(seconds=60)
    again = await decide(h, runtime, {**body, "request_id": "retry"})
    assert again["approval"]["id"] == first["approval"]["id"]
    assert again["approval"]["require"] == [{"role": "manager", "count": 1}]


@pytest.mark.parametrize("on_expired", [
    {"require": [], "timeout_ms": 1000, "distinct_from": "initiator"},
    {"timeout_ms": 1000, "distinct_from": "initiator"},
    {"require": [{"role": "runtime", "count": 1}], "timeout_ms": 1000},
    {"require": [{"role": "manager", "count": 1}], "break_glass": False},
    {"require": [{"role": "m1", "count": 1}], "on_expired": {
        "require": [{"role": "m2", "count": 1}], "on_expired": {
            "require": [{"role": "m3", "count": 1}]}}},  # a fourth stage
])
async def test_k15_a_malformed_stage_is_a_policy_error(
        clocked: tuple[Harness, FrozenClock], tenant: str, on_expired: dict[str, Any]) -> None:
    h, _ = clocked
    runtime = await h.headers(tenant, "runtime")
    result = escalating()
    result["approval"]["on_expired"] = on_expired
    decision = await decide(h, runtime, scripted(result))
    assert decision["effect"] == "deny" and decision["approval"] is None
    assert decision["reasons"][0]["code"] == "policy_error"
