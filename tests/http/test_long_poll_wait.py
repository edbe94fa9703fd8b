"""A long-poll (``GET /v1/approvals/{id}?wait=s``) waits on the request's status alone
(one indexed row per poll) and answers the whole state as soon as it changes: a review
ends the wait, so does the stage's end (expiry wins), and a request still pending at the
deadline is answered pending."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from cosigner.core.clock import FrozenClock
from tests.conftest import decision_request
from tests.http.approval_helpers import decide, refund_args, review

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


async def test_a_review_ends_the_wait(harness_factory: Callable[..., Any], tenant: str) -> None:
    h = await harness_factory()
    runtime = await h.headers(tenant, "runtime", subject="orchestrator")
    finance = await h.headers(tenant, "finance", subject="alice")
    opened = await decide(h, runtime, decision_request(args=refund_args(150_000)))
    approval_id = opened["approval"]["id"]

    async def reviewed_later() -> None:
        await asyncio.sleep(0.5)
        assert (await review(h, finance, approval_id)).status_code == 200

    started = time.monotonic()
    answer, _ = await asyncio.gather(
        h.client.get(f"/v1/approvals/{approval_id}?wait=20", headers=runtime),
        reviewed_later())
    assert answer.status_code == 200
    body = answer.json()
    assert body["status"] == "approved" and body["permit"]["token"]
    assert [r["subject"] for r in body["reviews"]] == ["alice"]
    assert time.monotonic() - started < 10


async def test_the_stage_end_ends_the_wait_and_the_deadline_answers_pending(
        harness_factory: Callable[..., Any], tenant: str) -> None:
    clock = FrozenClock(T0)
    h = await harness_factory(clock=clock)
    runtime = await h.headers(tenant, "runtime", subject="orchestrator")
    opened = await decide(h, runtime, decision_request(args=refund_args(150_000)))
    approval_id = opened["approval"]["id"]
    pending = await h.client.get(f"/v1/approvals/{approval_id}?wait=0.5", headers=runtime)
    assert pending.json()["status"] == "pending" and pending.json()["retry_after"]

    async def time_passes() -> None:
        await asyncio.sleep(0.5)
        clock.at = T0 + timedelta(days=30)  # far past every stage's end

    started = time.monotonic()
    answer, _ = await asyncio.gather(
        h.client.get(f"/v1/approvals/{approval_id}?wait=20", headers=runtime),
        time_passes())
    assert answer.json()["status"] == "expired", answer.text
    assert time.monotonic() - started < 10
