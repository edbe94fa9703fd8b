"""Tenant heads of the decision log are locked in one global order by every batch writer,
so concurrent batches never deadlock (PostgreSQL would abort one and answer 503)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.http.approval_helpers import redeem, scripted, write_scripted_bundle


async def test_decision_and_refusal_batches_of_two_tenants_never_deadlock(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    # The decision batch and the redeem-refusal batch each hold several tenants' heads;
    # taken in arrival order, a batch holding A waiting for B met one holding B waiting
    # for A (PostgreSQL: deadlock detected → 503 for the whole refusal batch).
    h = await harness_factory(bundle_dirs=[write_scripted_bundle(tmp_path / "b")],
                              log_batch_wait_ms=5)
    first = await h.headers(f"{tenant}-a", "runtime")
    second = await h.headers(f"{tenant}-b", "runtime")
    codes: Counter[int] = Counter()
    for _ in range(10):
        calls = []
        for _ in range(30):
            calls += [
                h.client.post("/v1/decisions", headers=first, json=scripted({"effect": "deny"})),
                h.client.post("/v1/decisions", headers=second, json=scripted({"effect": "deny"})),
                redeem(h, second, "not.a.permit", "delete_file", {}),
                redeem(h, first, "not.a.permit", "delete_file", {}),
            ]
        codes.update(r.status_code for r in await asyncio.gather(*calls))
    assert codes == {200: 600, 403: 600}
