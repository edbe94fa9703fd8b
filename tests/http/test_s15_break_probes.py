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
