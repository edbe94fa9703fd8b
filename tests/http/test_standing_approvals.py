"""Bounded standing approvals (issue 18): an approver extends one approval to later calls
of the same tool whose args meet constraints they confirm, up to ``max_uses`` times and
``ttl_s``; an explicit reject, a policy deny and a revoke always win; every permit is its
own, bound to its own args (K09)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from cosigner.core.clock import FrozenClock
from cosigner.db.tables import audit_events
from tests.conftest import Harness
from tests.http.approval_helpers import (
    decide,
    needs,
    redeem,
    refund_args,
    review,
    scripted,
    write_scripted_bundle,
)

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
SAME_ORDER_UP_TO_2000 = [{"pointer": "/order_id", "op": "equals", "value": "ord_8472"},
                         {"pointer": "/amount_minor", "op": "max", "value": 200_000}]


def refund_needs(*, standing: dict[str, int] | None = None, count: int = 1,
                 mask: list[str] | None = None) -> dict[str, Any]:
    result = needs(("finance", count))
    result["approval"]["standing"] = standing or {"max_ttl_s": 3600, "max_uses": 2}
    if mask is not None:
        result["mask"] = mask
    return result


def refund(run: str, amount: int, result: dict[str, Any] | None = None) -> dict[str, Any]:
    return scripted(result or refund_needs(), args=refund_args(amount), tool="issue_refund",
                    run=run)


def grant(scope: str = "run", constraints: list[dict[str, Any]] | None = None,
          **extra: Any) -> dict[str, Any]:
    return {"scope": scope, "constraints": constraints or SAME_ORDER_UP_TO_2000, **extra}


@pytest.fixture
async def sh(harness_factory: Callable[..., Any], tmp_path: Path
             ) -> tuple[Harness, FrozenClock]:
    clock = FrozenClock(T0)
    h: Harness = await harness_factory(clock=clock,
                                       bundle_dirs=[write_scripted_bundle(tmp_path / "b")])
    return h, clock


async def event_types(h: Harness, tenant: str) -> list[str]:
    async with h.db.read() as conn:
        return list((await conn.execute(select(audit_events.c.type).where(
            audit_events.c.tenant == tenant).order_by(audit_events.c.seq))).scalars())


async def approve_with_standing(h: Harness, approver: dict[str, str], approval_id: str,
                                standing: dict[str, Any]) -> httpx.Response:
    return await review(h, approver, approval_id, standing=standing)


async def standing_list(h: Harness, headers: dict[str, str], active: bool = True
                        ) -> list[dict[str, Any]]:
    resp = await h.client.get("/v1/standing-approvals", headers=headers,
                              params={"active": str(active).lower()})
    assert resp.status_code == 200, resp.text
    items: list[dict[str, Any]] = resp.json()["items"]
    return items


async def test_used_for_matching_calls_refused_for_others_and_stops_at_max_uses(
        sh: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, _ = sh
    runtime = await h.headers(tenant, "runtime")
    alice = await h.headers(tenant, "finance", subject="alice")
    run = f"run-{uuid.uuid4().hex[:8]}"
    first = await decide(h, runtime, refund(run, 150_000))
    resp = await approve_with_standing(h, alice, first["approval"]["id"], grant())
    assert resp.status_code == 200 and resp.json()["status"] == "approved", resp.text
    (item,) = await standing_list(h, alice)
    assert (item["scope"], item["uses"], item["max_uses"]) == ("run", 0, 2)

    body = refund(run, 180_000)
    used = await decide(h, runtime, body)
    assert used["effect"] == "allow" and used["approval"] is None
    assert used["reasons"][0]["code"] == "approved_by_standing"
    assert item["id"] in used["reasons"][0]["message"]
    token = used["permit"]["token"]
    other = await redeem(h, runtime, token, "issue_refund", refund_args(150_000))
    assert (other.status_code, other.json()["code"]) == (403, "args_mismatch")  # K09
    assert (await redeem(h, runtime, token, "issue_refund", body["args"])).status_code == 200
    again = await redeem(h, runtime, token, "issue_refund", body["args"])
    assert again.json()["code"] == "already_redeemed"

    above = await decide(h, runtime, refund(run, 250_000))  # amount above the bound
    assert above["effect"] == "require_approval"
    other_run = await decide(h, runtime, refund(f"{run}-b", 100_000))  # scope: this run
    assert other_run["effect"] == "require_approval"
    assert (await decide(h, runtime, refund(run, 100_000)))["effect"] == "allow"  # 2 of 2
    spent = await decide(h, runtime, refund(run, 120_000))
    assert spent["effect"] == "require_approval"
    assert await standing_list(h, alice) == []
    assert [i["uses"] for i in await standing_list(h, alice, active=False)] == [2]
    types = await event_types(h, tenant)
    assert types.count("standing.granted") == 1 and types.count("standing.used") == 2


async def test_stops_at_its_ttl_and_a_ttl_scope_spans_runs(
        sh: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, clock = sh
    runtime = await h.headers(tenant, "runtime")
    alice = await h.headers(tenant, "finance", subject="alice")
    first = await decide(h, runtime, refund("run-1", 150_000))
    resp = await approve_with_standing(h, alice, first["approval"]["id"],
                                       grant("ttl", ttl_s=60, max_uses=2))
    assert resp.status_code == 200, resp.text
    clock.advance(seconds=60, microseconds=-1)
    assert (await decide(h, runtime, refund("run-2", 150_000)))["effect"] == "allow"
    clock.advance(microseconds=1)  # now == expires_at: over
    assert (await decide(h, runtime, refund("run-3", 150_000)))["effect"] == "require_approval"


async def test_loses_to_an_explicit_reject_a_deny_and_a_revoke(
        sh: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, _ = sh
    runtime = await h.headers(tenant, "runtime")
    alice = await h.headers(tenant, "finance", subject="alice")
    bob = await h.headers(tenant, "finance", subject="bob")
    run = f"run-{uuid.uuid4().hex[:8]}"
    rejected = await decide(h, runtime, refund(run, 90_000))
    first = await decide(h, runtime, refund(run, 150_000))
    resp = await review(h, alice, rejected["approval"]["id"], "rejected", "not this one")
    assert resp.status_code == 200
    resp = await approve_with_standing(h, alice, first["approval"]["id"],
                                       grant(max_uses=2))
    assert resp.status_code == 200, resp.text
    # The rejected call stays rejected, although it matches the standing approval.
    again = await decide(h, runtime, refund(run, 90_000))
    assert again["effect"] == "deny"
    assert again["reasons"][0]["code"] == "rejected_by_reviewer"
    # A policy deny is never turned into allow.
    denied = await decide(h, runtime, refund(run, 100_000, {"effect": "deny",
                                                           "reasons": ["blocked"]}))
    assert denied["effect"] == "deny"
    (item,) = await standing_list(h, alice)
    assert item["uses"] == 0
    # A revoke wins over later calls and over a permit of it not yet redeemed.
    body = refund(run, 110_000)
    allowed = await decide(h, runtime, body)
    assert allowed["effect"] == "allow"
    refused = await h.client.post(f"/v1/standing-approvals/{item['id']}/revoke",
                                  headers=runtime)
    assert (refused.status_code, refused.json()["code"]) == (403, "not_eligible"), refused.text
    revoked = await h.client.post(f"/v1/standing-approvals/{item['id']}/revoke",
                                  headers=bob)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    resp = await redeem(h, runtime, allowed["permit"]["token"], "issue_refund", body["args"])
    assert (resp.status_code, resp.json()["code"]) == (409, "policy_changed")
    after = await decide(h, runtime, refund(run, 120_000))
    assert after["effect"] == "require_approval"
    assert "standing.revoked" in await event_types(h, tenant)


@pytest.mark.parametrize(("result", "standing", "code"), [
    (needs(("finance", 1)), grant(), "standing_not_allowed"),
    (refund_needs(count=2), grant(), "standing_needs_one_approver"),
    (refund_needs(mask=["/amount_minor"]), grant(), "standing_masked_path"),
    (refund_needs(), grant(constraints=[{"pointer": "/amount_minor", "op": "max",
                                         "value": 100}]), "standing_mismatch"),
    (refund_needs(), grant(max_uses=3), "invalid_standing"),
    (refund_needs(), grant(ttl_s=3601), "invalid_standing"),
    (refund_needs(), grant(constraints=[{"pointer": "/amount_minor", "op": "max",
                                         "value": "1e9"}]), "invalid_standing"),
])
async def test_a_grant_outside_the_policy_bounds_is_refused(
        sh: tuple[Harness, FrozenClock], tenant: str, result: dict[str, Any],
        standing: dict[str, Any], code: str) -> None:
    h, _ = sh
    runtime = await h.headers(tenant, "runtime")
    alice = await h.headers(tenant, "finance", subject="alice")
    approval = (await decide(h, runtime, refund("run-1", 150_000, result)))["approval"]
    resp = await approve_with_standing(h, alice, approval["id"], standing)
    assert (resp.status_code, resp.json()["code"]) == (422, code)
    state = await h.client.get(f"/v1/approvals/{approval['id']}", headers=runtime)
    assert state.json()["status"] == "pending" and state.json()["reviews"] == []
    assert await standing_list(h, alice, active=False) == []


async def test_uses_are_never_overspent_across_replicas(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    bundle = write_scripted_bundle(tmp_path / "b")
    one: Harness = await harness_factory(bundle_dirs=[bundle])
    two: Harness = await harness_factory(bundle_dirs=[bundle])  # same database: a replica
    runtime = await one.headers(tenant, "runtime")
    alice = await one.headers(tenant, "finance", subject="alice")
    run = f"run-{uuid.uuid4().hex[:8]}"
    first = await decide(one, runtime, refund(run, 150_000))
    resp = await approve_with_standing(one, alice, first["approval"]["id"],
                                       grant(max_uses=2))
    assert resp.status_code == 200, resp.text
    calls = [decide(h, runtime, refund(run, 100_000 + i))
             for i, h in enumerate([one, two] * 4)]
    effects = [d["effect"] for d in await asyncio.gather(*calls)]
    assert sorted(effects) == ["allow"] * 2 + ["require_approval"] * 6
    assert [i["uses"] for i in await standing_list(two, alice, active=False)] == [2]


@pytest.mark.parametrize("standing", [
    {"max_ttl_s": 0, "max_uses": 1}, {"max_ttl_s": 60, "max_uses": 0},
    {"max_ttl_s": 60}, {"max_ttl_s": 60, "max_uses": True}, "always",
])
async def test_a_malformed_standing_rule_is_a_policy_error(
        sh: tuple[Harness, FrozenClock], tenant: str, standing: Any) -> None:
    h, _ = sh
    runtime = await h.headers(tenant, "runtime")
    result = needs(("finance", 1))
    result["approval"]["standing"] = standing
    decision = await decide(h, runtime, refund("run-1", 150_000, result))
    assert decision["effect"] == "deny" and decision["reasons"][0]["code"] == "policy_error"
