"""Attacks on the approval and decision paths found in review (separation of duties,
masking at rest, one tenant's unstorable value poisoning a shared group-commit batch)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.db.tables_approvals import approvals
from tests.conftest import Harness
from tests.http.approval_helpers import decide, needs, review, scripted, write_scripted_bundle


@pytest.fixture
async def sh(harness_factory: Callable[..., Any], tmp_path: Path) -> Harness:
    h: Harness = await harness_factory(bundle_dirs=[write_scripted_bundle(tmp_path / "b")])
    return h


@pytest.mark.parametrize("role", ["runtime", "admin", "auditor", " finance", "Finance"])
async def test_k15_requirement_naming_a_builtin_or_invalid_role_is_a_policy_error(
        sh: Harness, tenant: str, role: str) -> None:
    # A requirement {role: runtime} would let another agent runtime of the tenant approve
    # the call (the requesting side approving itself); a role nobody can hold is a policy
    # mistake too. Both deny with policy_error and open nothing.
    runtime = await sh.headers(tenant, "runtime", subject="orchestrator")
    decision = await decide(sh, runtime, scripted(needs((role, 1))))
    assert decision["effect"] == "deny" and decision["approval"] is None
    assert decision["reasons"][0]["code"] == "policy_error"
    async with sh.db.read() as conn:
        assert (await conn.execute(select(approvals.c.id).where(
            approvals.c.tenant == tenant))).first() is None


@pytest.mark.parametrize("field", ["request_id", "run", "principal", "initiator", "trace",
                                   "tool_version"])
async def test_nul_in_an_id_is_422_and_never_sinks_other_tenants_batch(
        sh: Harness, tenant: str, field: str) -> None:
    # PostgreSQL text cannot hold NUL. Such an id used to reach the shared group-commit
    # batch, fail its bulk insert and answer 503 to every decision in it, other tenants'
    # included. It is refused at the wire now (422), like the approval texts.
    runtime = await sh.headers(tenant, "runtime", subject="orchestrator")
    neighbour = await sh.headers(f"{tenant}-n", "runtime", subject="orchestrator")
    poison = scripted({"effect": "allow"}, request_id="req-\x00")
    if field != "request_id":
        poison = scripted({"effect": "allow"})
        if field == "run":
            poison["run"] = {"id": "run-\x00"}
        elif field == "trace":
            poison["run"] = {"id": "run-1", "trace_id": "t\x00"}
        elif field == "tool_version":
            poison["tool"] = {"name": "delete_file", "version": "1\x00"}
        else:
            poison[field] = {"id": "someone\x00", "type": "user"}
    answers = await asyncio.gather(
        sh.client.post("/v1/decisions", headers=runtime, json=poison),
        *[sh.client.post("/v1/decisions", headers=neighbour,
                         json=scripted({"effect": "allow"})) for _ in range(20)])
    assert (answers[0].status_code, answers[0].json()["code"]) == (422, "validation_failed")
    assert [a.status_code for a in answers[1:]] == [200] * 20


async def test_masked_values_of_an_approval_request_never_reach_the_database(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    # Invariant 10, at rest: the approval request's stored arguments are masked like the
    # decision log and call_inputs; the page and the permit still agree on the args hash.
    from tests.audit.test_masking_proof import SECRETS, masking_bundle, tables_holding

    root = masking_bundle(tmp_path)
    (root / "masking" / "rules.py").write_text(
        'def decide(input):\n'
        '    return {"effect": "require_approval", "mask": ["/note"], "approval": {\n'
        '        "require": [{"role": "finance", "count": 1}], "timeout_ms": 60000}}\n')
    h: Harness = await harness_factory(bundle_dirs=[root])
    runtime = await h.headers(tenant, "runtime")
    finance = await h.headers(tenant, "finance", subject="alice")
    args = {"card_number": SECRETS["catalogue"], "note": SECRETS["policy"],
            "api_key": SECRETS["always"], "amount_minor": 100}
    decision = await decide(h, runtime, scripted({}, tool="charge_card", args=args))
    approval_id = decision["approval"]["id"]
    approved = (await review(h, finance, approval_id)).json()
    assert approved["status"] == "approved"
    assert approved["args"] == {"amount_minor": 100, "api_key": "•••", "card_number": "•••",
                                "note": "•••"}
    assert approved["args_hash"] == decision["args_hash"]
    for name, secret in SECRETS.items():
        assert await tables_holding(h, secret.split()[-1], tenant) == set(), name
