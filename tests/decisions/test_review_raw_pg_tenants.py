"""Review (session 5): the asyncpg batch's guard searches decisions and runs with
``tenant = ANY(…) AND id = ANY(…)`` (a cross product): another tenant's request id or run
contract in the same batch must never answer or constrain this tenant's call (DESIGN
invariant 7)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import decision_request


@pytest.fixture(autouse=True)
def _postgres_only(db_kind: str) -> None:
    if db_kind != "postgres":
        pytest.skip("the asyncpg batch is PostgreSQL's")


async def test_another_tenants_request_id_and_contract_never_cross(
        harness: Any, tenant: str) -> None:
    other = tenant + "-b"
    a = await harness.headers(tenant, "runtime")
    b = await harness.headers(other, "runtime")
    run_a, run_b = f"{tenant}-ra", f"{tenant}-rb"
    # Tenant A: request id X decided, a contract on run_b allowing no tool call.
    first = decision_request(request_id="shared-x", run={"id": run_a, "step": 1})
    decided = await harness.client.post("/v1/decisions", headers=a, json=first)
    assert decided.status_code == 200, decided.text
    contract = await harness.client.post("/v1/runs", headers=a, json={
        "run_id": run_b, "budget": {"max_tool_calls": 0}})
    assert contract.status_code == 201, contract.text
    # One batch: A retries X; B uses X for another call, and calls in its own run_b.
    b_x = decision_request(request_id="shared-x", run={"id": run_a, "step": 1})
    b_x["args"]["amount_minor"] = 4000
    b_run = decision_request(request_id="b-run", run={"id": run_b, "step": 1})
    retry, other_x, other_run = await asyncio.gather(
        harness.client.post("/v1/decisions", headers=a, json=first),
        harness.client.post("/v1/decisions", headers=b, json=b_x),
        harness.client.post("/v1/decisions", headers=b, json=b_run))
    assert retry.status_code == 200 and retry.json() == decided.json()
    assert other_x.status_code == 200, other_x.text
    assert other_x.json()["decision_id"] != decided.json()["decision_id"]
    assert other_x.json()["effect"] == "allow"
    assert other_run.status_code == 200, other_run.text
    assert other_run.json()["effect"] == "allow", other_run.json()  # A's contract: not B's
