"""Attacks on the approval and decision paths found in review (separation of duties,
masking at rest, one tenant's unstorable value poisoning a shared group-commit batch)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from server.db.tables_approvals import approvals
from tests.api.approval_helpers import decide, needs, scripted, write_scripted_bundle
from tests.conftest import Harness


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
