"""Session 15 break probes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.http.approval_helpers import decide, needs, review, scripted, scripted_harness


async def test_one_person_approving_two_calls_of_a_run_at_once_counts_once(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    """distinct_from previous: carol approves two calls of one run concurrently; at most
    one of her approvals may be accepted (DESIGN invariant 6), on PostgreSQL too."""
    h = await scripted_harness(harness_factory, tmp_path)
    runtime = await h.headers(tenant, "runtime")
    carol = await h.headers(tenant, "finance", subject="carol")
    for attempt in range(5):
        ids = [(await decide(h, runtime, scripted(
            needs(("finance", 1), distinct_from="previous"), run=f"run-race-{attempt}",
            args={"path": p})))["approval"]["id"] for p in ("/a", "/b")]
        answers = await asyncio.gather(*(review(h, carol, i) for i in ids))
        codes = sorted(a.status_code for a in answers)
        assert codes == [200, 403], [a.text for a in answers]


async def test_a_looser_escalation_stage_does_not_carry_a_permit_the_first_stage_refuses(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    """The active policy now asks a step-up of the first stage and keeps the old rules
    only for a stage it escalates to an hour later. A permit approved (at once, without
    step-up) under the old policy is not one the new policy would have granted then."""
    from tests.http.approval_helpers import redeem, state, write_scripted_bundle

    root = write_scripted_bundle(tmp_path / "b")
    h = await harness_factory(bundle_dirs=[root])
    runtime = await h.headers(tenant, "runtime")
    alice = await h.headers(tenant, "finance", subject="alice")
    old = needs(("finance", 1), distinct_from="initiator")
    approval_id = (await decide(h, runtime, scripted(old, args={"path": "/1"})))[
        "approval"]["id"]
    assert (await review(h, alice, approval_id)).status_code == 200
    token = (await state(h, runtime, approval_id))["permit"]["token"]
    tightened = {"require": [{"role": "finance", "count": 1}], "timeout_ms": 3_600_000,
                 "distinct_from": "initiator", "assurance": "mfa",
                 "on_expired": {"require": [{"role": "finance", "count": 1}],
                                "timeout_ms": 600_000, "distinct_from": "initiator"}}
    write_scripted_bundle(root, rules="return " + repr(
        {"effect": "require_approval", "reasons": ["scripted"], "approval": tightened}))
    h.context.store.reload()
    resp = await redeem(h, runtime, token, "delete_file", {"path": "/1"})
    assert (resp.status_code, resp.json().get("code")) == (409, "policy_changed"), resp.text
