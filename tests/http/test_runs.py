"""Run contracts (POST /v1/runs), outcome reports and permit state over HTTP (ASGI)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.audit.chain import GENESIS, verify_bodies
from cosigner.core.clock import FrozenClock
from cosigner.db.tables import audit_events
from cosigner.runs import contracts
from tests.conftest import Harness, decision_request

READ = {"order_id": "ord_8472"}


def contract(run_id: str, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "run_id": run_id,
        "allowed_tools": ["get_order", "issue_refund"],
        "tool_limits": {"issue_refund": 1},
        "budget": {"max_tool_calls": 5, "max_cost": 1000},
        "deadline": "2100-01-01T00:00:00Z",
    }
    body.update(overrides)
    return body


async def decide(h: Harness, headers: dict[str, str], run_id: str, tool: str = "get_order",
                 args: dict[str, Any] | None = None) -> dict[str, Any]:
    body = decision_request(run={"id": run_id}, tool={"name": tool},
                            args=args if args is not None else READ)
    resp = await h.client.post("/v1/decisions", headers=headers, json=body)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


async def events_of(h: Harness, tenant: str) -> list[dict[str, Any]]:
    async with h.db.read() as conn:
        rows = (await conn.execute(select(audit_events.c.body, audit_events.c.hash)
                                   .where(audit_events.c.tenant == tenant)
                                   .order_by(audit_events.c.seq))).all()
    assert verify_bodies([(r.body, r.hash) for r in rows], start_prev=GENESIS) == (None, None)
    return [json.loads(r.body) for r in rows]


# ------------------------------------------------------------------------- registration


async def test_register_is_idempotent_and_never_widens(harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    first = await harness.client.post("/v1/runs", headers=headers, json=contract("run-a"))
    assert first.status_code == 201, first.text
    assert first.json()["contract"]["allowed_tools"] == ["get_order", "issue_refund"]
    again = await harness.client.post("/v1/runs", headers=headers, json=contract("run-a"))
    assert again.status_code == 200 and again.json()["contract"] == first.json()["contract"]
    # Same deadline written another way is the same contract.
    same = await harness.client.post("/v1/runs", headers=headers, json=contract(
        "run-a", deadline="2100-01-01T00:00:00+00:00",
        allowed_tools=["issue_refund", "get_order"]))
    assert same.status_code == 200
    for wider in (contract("run-a", allowed_tools=["get_order", "issue_refund", "x"]),
                  contract("run-a", budget={"max_tool_calls": 6, "max_cost": 1000}),
                  contract("run-a", deadline=None),
                  contract("run-a", tool_limits={"issue_refund": 1, "get_order": 3})):
        resp = await harness.client.post("/v1/runs", headers=headers, json=wider)
        assert resp.status_code == 409 and resp.json()["code"] == "contract_conflict"
    got = await harness.client.get("/v1/runs/run-a", headers=headers)
    assert got.status_code == 200 and got.json()["tool_calls"] == 0
    types = [e["type"] for e in await events_of(harness, tenant)]
    assert types.count("run.contract_registered") == 1


@pytest.mark.parametrize("body", [
    contract("r", tool_limits={"delete_customer": 1}),
    contract("r", deadline="2100-01-01T00:00:00"),
    contract("r", deadline="tomorrow"),
    contract("r", budget={"max_tool_calls": -1}),
    contract("r", budget={"max_cost": 2**53}),
    {**contract("r"), "skip_checks": True},
])
async def test_invalid_contracts_are_422(harness: Harness, tenant: str,
                                         body: dict[str, Any]) -> None:
    headers = await harness.headers(tenant, "runtime")
    resp = await harness.client.post("/v1/runs", headers=headers, json=body)
    assert resp.status_code == 422, resp.text


async def test_contract_needs_runtime_role_and_stays_in_tenant(harness: Harness,
                                                               tenant: str) -> None:
    auditor = await harness.headers(tenant, "auditor")
    resp = await harness.client.post("/v1/runs", headers=auditor, json=contract("r"))
    assert resp.status_code == 403
    runtime = await harness.headers(tenant, "runtime")
    assert (await harness.client.post("/v1/runs", headers=runtime,
                                      json=contract("r"))).status_code == 201
    other = await harness.headers(tenant + "x", "runtime")
    assert (await harness.client.get("/v1/runs/r", headers=other)).status_code == 404
    # The other tenant may register its own run with the same id.
    assert (await harness.client.post("/v1/runs", headers=other, json=contract(
        "r", allowed_tools=None, tool_limits={}))).status_code == 201


# ------------------------------------------------------------------------- enforcement


async def test_tool_outside_contract_is_denied_and_logged(harness: Harness,
                                                           tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    await harness.client.post("/v1/runs", headers=headers, json=contract("run-b"))
    data = await decide(harness, headers, "run-b", "get_payment_events")
    assert data["effect"] == "deny" and data["permit"] is None
    assert data["reasons"][0]["code"] == "outside_contract"
    made = [e for e in await events_of(harness, tenant) if e["type"] == "decision.made"]
    assert made[-1]["effect"] == "deny"
    assert made[-1]["payload"]["reasons"][0]["code"] == "outside_contract"
    # Runs without a contract are not restricted.
    assert (await decide(harness, headers, "run-free", "get_payment_events"))["effect"] == "allow"


async def test_contract_registered_on_another_replica_is_enforced(harness: Harness,
                                                                   tenant: str) -> None:
    """A process that never saw the registration (another replica) decides without a
    contract pre-read; the decision's write transaction finds the contract, writes
    nothing, and the decision is taken again with it: on the prepared (allow/deny) path
    and on the path that opens an approval request alike. Counted once."""
    headers = await harness.headers(tenant, "runtime")
    refund = {"order_id": "ord_8472", "amount_minor": 150000, "currency": "USD",
              "reason_code": "duplicate_charge"}
    registered = await harness.client.post("/v1/runs", headers=headers, json=contract(
        "run-x", tool_limits={"issue_refund": 1}))
    assert registered.status_code == 201, registered.text
    deps = harness.context

    def forget() -> None:  # what a replica that did not register it knows
        object.__setattr__(deps, "contracted_runs", contracts.ContractedRuns())

    forget()
    outside = await decide(harness, headers, "run-x", "get_payment_events")
    assert (outside["effect"], outside["reasons"][0]["code"]) == ("deny", "outside_contract")
    forget()
    assert (await decide(harness, headers, "run-x", "issue_refund", refund)
            )["effect"] == "require_approval"
    forget()
    again = await decide(harness, headers, "run-x", "issue_refund", {**refund,
                                                                     "amount_minor": 150001})
    assert (again["effect"], again["reasons"][0]["code"]) == ("deny", "budget_exhausted")
    run = (await harness.client.get("/v1/runs/run-x", headers=headers)).json()
    assert run["tool_calls"] == 1 and run["tool_counts"] == {"issue_refund": 1}
    made = [e for e in await events_of(harness, tenant) if e["type"] == "decision.made"]
    assert [e["effect"] for e in made] == ["deny", "require_approval", "deny"]


async def test_budget_and_tool_limit_exhaust(harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    await harness.client.post("/v1/runs", headers=headers, json=contract(
        "run-c", budget={"max_tool_calls": 3}))
    refund = {"order_id": "ord_8472", "amount_minor": 500, "currency": "USD",
              "reason_code": "duplicate_charge"}
    assert (await decide(harness, headers, "run-c", "issue_refund", refund))["effect"] == "allow"
    second = await decide(harness, headers, "run-c", "issue_refund", refund)
    assert (second["effect"], second["reasons"][0]["code"]) == ("deny", "budget_exhausted")
    assert (await decide(harness, headers, "run-c"))["effect"] == "allow"
    assert (await decide(harness, headers, "run-c"))["effect"] == "allow"
    last = await decide(harness, headers, "run-c")
    assert (last["effect"], last["reasons"][0]["code"]) == ("deny", "budget_exhausted")
    run = (await harness.client.get("/v1/runs/run-c", headers=headers)).json()
    assert run["tool_calls"] == 3
    assert run["tool_counts"] == {"issue_refund": 1, "get_order": 2}


async def test_deadline_passes_at_the_instant(harness_factory: Any, tenant: str) -> None:
    clock = FrozenClock(datetime(2030, 1, 1, 11, 59, 59, tzinfo=UTC))
    h: Harness = await harness_factory(clock=clock)
    headers = await h.headers(tenant, "runtime")
    await h.client.post("/v1/runs", headers=headers,
                        json=contract("run-d", deadline="2030-01-01T12:00:00Z"))
    assert (await decide(h, headers, "run-d"))["effect"] == "allow"
    clock.advance(seconds=1)
    data = await decide(h, headers, "run-d")
    assert (data["effect"], data["reasons"][0]["code"]) == ("deny", "deadline_passed")


async def test_concurrent_calls_cannot_overspend(harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    await harness.client.post("/v1/runs", headers=headers, json=contract(
        "run-e", budget={"max_tool_calls": 5}))
    results = await asyncio.gather(*(decide(harness, headers, "run-e") for _ in range(25)))
    effects = sorted(r["effect"] for r in results)
    assert effects.count("allow") == 5 and effects.count("deny") == 20
    run = (await harness.client.get("/v1/runs/run-e", headers=headers)).json()
    assert run["tool_calls"] == 5


async def test_policy_sees_contract_and_counters(harness_factory: Any, tenant: str,
                                                 tmp_path: Path) -> None:
    bundle = tmp_path / "bundles" / "echo"
    bundle.mkdir(parents=True)
    (bundle / "manifest.toml").write_text(
        'id = "echo"\nversion = "1"\nengine = "python"\nentrypoint = "decide"\n'
        'tenants = ["*"]\n')
    (bundle / "rules.py").write_text(
        "import json\n"
        "def decide(input):\n"
        "    return {'effect': 'allow', 'reasons': [{'code': 'echo', "
        "'message': json.dumps(input['run'], sort_keys=True)}]}\n")
    h: Harness = await harness_factory(bundle_dirs=[tmp_path / "bundles"])
    headers = await h.headers(tenant, "runtime")
    await h.client.post("/v1/runs", headers=headers, json=contract(
        "run-f", allowed_tools=None, tool_limits={}))
    await decide(h, headers, "run-f")
    seen = json.loads((await decide(h, headers, "run-f"))["reasons"][0]["message"])
    assert seen["id"] == "run-f"
    assert seen["contract"]["budget"] == {"max_tool_calls": 5, "max_cost": 1000}
    assert (seen["tool_calls"], seen["cost_minor"], seen["tool_counts"]) == (
        1, 0, {"get_order": 1})


# ------------------------------------------------------------------------- outcomes


async def test_outcome_is_recorded_once_and_counts_cost(harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    await harness.client.post("/v1/runs", headers=headers, json=contract(
        "run-g", budget={"max_cost": 100}, tool_limits={}))
    first = await decide(harness, headers, "run-g")
    url = f"/v1/decisions/{first['decision_id']}/outcome"
    report = {"outcome": "ok", "side_effect": "none", "cost_minor": 100}
    resp = await harness.client.post(url, headers=headers, json=report)
    assert resp.status_code == 200, resp.text
    assert resp.json()["cost_minor"] == 100
    again = await harness.client.post(url, headers=headers, json=report)
    assert again.status_code == 200 and again.json() == resp.json()
    other = await harness.client.post(url, headers=headers,
                                      json={**report, "side_effect": "committed"})
    assert other.status_code == 409 and other.json()["code"] == "outcome_conflict"
    run = (await harness.client.get("/v1/runs/run-g", headers=headers)).json()
    assert run["cost_minor"] == 100
    spent = await decide(harness, headers, "run-g")
    assert (spent["effect"], spent["reasons"][0]["code"]) == ("deny", "budget_exhausted")
    reported = [e for e in await events_of(harness, tenant) if e["type"] == "outcome.reported"]
    assert len(reported) == 1
    assert reported[0]["subject"]["decision_id"] == first["decision_id"]
    assert reported[0]["payload"] == report


@pytest.mark.parametrize("body", [
    {"outcome": "fine", "side_effect": "none"},
    {"outcome": "ok", "side_effect": "maybe"},
    {"outcome": "ok", "side_effect": "none", "cost_minor": -1},
    {"outcome": "ok", "side_effect": "none", "cost_minor": 1.5},
    {"outcome": "ok"},
    {"outcome": "ok", "side_effect": "none", "approved": True},
])
async def test_invalid_outcome_is_422(harness: Harness, tenant: str,
                                      body: dict[str, Any]) -> None:
    headers = await harness.headers(tenant, "runtime")
    decision = await decide(harness, headers, "run-h")
    resp = await harness.client.post(f"/v1/decisions/{decision['decision_id']}/outcome",
                                     headers=headers, json=body)
    assert resp.status_code == 422, resp.text


async def test_outcome_of_another_tenant_is_404(harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    decision = await decide(harness, headers, "run-i")
    other = await harness.headers(tenant + "x", "runtime")
    resp = await harness.client.post(f"/v1/decisions/{decision['decision_id']}/outcome",
                                     headers=other, json={"outcome": "ok",
                                                          "side_effect": "none"})
    assert resp.status_code == 404
    missing = await harness.client.post("/v1/decisions/nope/outcome", headers=headers,
                                        json={"outcome": "ok", "side_effect": "none"})
    assert missing.status_code == 404


# ------------------------------------------------------------------------- permit state


async def test_permit_state_is_tenant_scoped(harness: Harness, tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    decision = await decide(harness, headers, "run-j")
    jti = decision["permit"]["jti"]
    resp = await harness.client.get(f"/v1/permits/{jti}", headers=headers)
    assert resp.status_code == 200, resp.text
    state = resp.json()
    assert state["status"] == "issued" and state["redeemed_by_you"] is False
    assert state["args_hash"] == decision["args_hash"] and state["tool"] == "get_order"
    other = await harness.headers(tenant + "x", "runtime")
    assert (await harness.client.get(f"/v1/permits/{jti}", headers=other)).status_code == 404
