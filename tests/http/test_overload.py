"""Rate limits (429 ``rate_limited``) and load shedding (503 ``overloaded``) at every bound
(issue 19, case K30): answered at once with ``Retry-After``, logged, /readyz following."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from sqlalchemy import select, text

from cosigner.db.database import Database
from cosigner.db.tables import audit_events
from tests.conftest import Harness, decision_request

APPROVAL_ARGS = {"order_id": "ord_1", "amount_minor": 150000, "currency": "USD",
                 "reason_code": "duplicate_charge"}


def _limits(**values: int) -> dict[str, Any]:
    unlimited = {"credential_per_s": 0, "credential_burst": 0, "tenant_per_s": 0,
                 "tenant_burst": 0, "decisions_per_min": 0, "approvals_per_min": 0}
    return {"*": {**unlimited, **values}}


async def _refusal_events(harness: Harness, tenant: str) -> list[dict[str, Any]]:
    async with harness.db.read() as conn:
        bodies = (await conn.execute(select(audit_events.c.body).where(
            audit_events.c.tenant == tenant, audit_events.c.type == "request.refused")
            .order_by(audit_events.c.seq))).scalars().all()
    parsed = [json.loads(b) if isinstance(b, str) else dict(b) for b in bodies]
    return [dict(b["payload"]) for b in parsed
            if (b.get("payload") or {}).get("code") == "rate_limited"]


def _assert_problem(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == code
    assert int(response.headers["retry-after"]) >= 1


async def test_credential_burst_answers_429_with_retry_after_and_logs_refusals_bounded(
        harness_factory: Callable[..., Awaitable[Harness]], tenant: str) -> None:
    # 1/s sustained is counted over 10 s: 10 requests pass, then the credential waits.
    harness = await harness_factory(rate_limits=_limits(credential_per_s=1))
    harness.pin_rate_windows()
    headers = await harness.headers(tenant, "runtime", subject="rt-1")
    other = await harness.headers(tenant, "runtime", subject="rt-2")  # another credential
    responses = [await harness.client.post("/v1/decisions", headers=headers,
                                           json=decision_request()) for _ in range(17)]
    assert [r.status_code for r in responses[:10]] == [200] * 10
    for refused in responses[10:]:
        _assert_problem(refused, 429, "rate_limited")
        assert refused.json()["limit"] == "credential_per_s"
    # The limit is the credential's: another key of the tenant still decides.
    assert (await harness.client.post("/v1/decisions", headers=other,
                                      json=decision_request())).status_code == 200
    # Seven refusals, one event so far (the window's first, durable before its 429) ...
    first = await _refusal_events(harness, tenant)
    assert [(e["limit"], e["refused"], e["aggregate"]) for e in first] == [
        ("credential_per_s", 1, "first")]
    # ... and one more with the window's total once it is flushed.
    assert await harness.context.quotas.flush(everything=True) == 1
    events = await _refusal_events(harness, tenant)
    assert [(e["refused"], e["aggregate"]) for e in events] == [(1, "first"),
                                                                (7, "window_total")]


async def test_tenant_limit_sheds_the_flooding_tenant_not_the_other(
        harness_factory: Callable[..., Awaitable[Harness]], tenant: str) -> None:
    harness = await harness_factory(rate_limits=_limits(tenant_per_s=1))  # 10 per 10 s
    harness.pin_rate_windows()
    flooding = [await harness.headers(tenant, "runtime", subject=f"rt-{i}")
                for i in range(3)]
    quiet = await harness.headers(tenant + "-b", "runtime")
    statuses = [(await harness.client.post("/v1/decisions", headers=flooding[i % 3],
                                           json=decision_request())).status_code
                for i in range(15)]
    assert statuses[:10] == [200] * 10 and statuses[10:] == [429] * 5
    response = await harness.client.post("/v1/decisions", headers=quiet,
                                         json=decision_request())
    assert response.status_code == 200


async def test_decision_and_approval_quotas_per_minute(
        harness_factory: Callable[..., Awaitable[Harness]], tenant: str) -> None:
    harness = await harness_factory(rate_limits=_limits(decisions_per_min=3,
                                                        approvals_per_min=1))
    harness.pin_rate_windows()
    headers = await harness.headers(tenant, "runtime")
    opened = await harness.client.post("/v1/decisions", headers=headers, json=decision_request(
        run={"id": "run-a"}, args=APPROVAL_ARGS))
    assert opened.json()["effect"] == "require_approval"
    second = await harness.client.post("/v1/decisions", headers=headers, json=decision_request(
        run={"id": "run-b"}, args=APPROVAL_ARGS))
    _assert_problem(second, 429, "rate_limited")
    assert second.json()["limit"] == "approvals_per_min"
    assert (await harness.client.post("/v1/decisions", headers=headers,
                                      json=decision_request())).status_code == 200
    third = await harness.client.post("/v1/decisions", headers=headers,
                                      json=decision_request())
    _assert_problem(third, 429, "rate_limited")
    assert third.json()["limit"] == "decisions_per_min"
    assert 1 <= int(third.headers["retry-after"]) <= 60


@asynccontextmanager
async def _write_lock(harness: Harness) -> AsyncIterator[None]:
    """Hold the database's write lock from outside the app (another connection), so the
    decision-log writer's batch waits on it and its queue fills."""
    url = harness.settings.database_url
    if url.startswith("sqlite"):
        holder = sqlite3.connect(url.split("///", 1)[1], isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        return
    db = Database(url)
    try:
        async with db.engine.connect() as conn:
            await conn.execute(text("LOCK TABLE decisions IN EXCLUSIVE MODE"))
            try:
                yield
            finally:
                await conn.rollback()
    finally:
        await db.dispose()


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_full_log_writer_queue_sheds_503_at_once_flooding_tenant_first_and_readyz(
        harness_factory: Callable[..., Awaitable[Harness]], tenant: str) -> None:
    harness = await harness_factory(log_queue_max=2, log_queue_per_tenant_max=1,
                                    log_batch_max=1, log_batch_wait_ms=0)
    a = await harness.headers(tenant, "runtime")
    b = await harness.headers(tenant + "-b", "runtime")
    c = await harness.headers(tenant + "-c", "runtime")
    writer = harness.context.log_writer
    post = harness.client.post
    assert (await harness.client.get("/readyz")).status_code == 200
    async with _write_lock(harness):
        first = asyncio.create_task(post("/v1/decisions", headers=a, json=decision_request()))
        await _until(lambda: writer.stats.batches >= 1)  # in a batch, waiting on the lock
        queued_a = asyncio.create_task(post("/v1/decisions", headers=a,
                                            json=decision_request()))
        await _until(lambda: writer.depth == 1)
        # Tenant A holds its share of the queue: its next decision is shed at once ...
        _assert_problem(await post("/v1/decisions", headers=a, json=decision_request()),
                        503, "overloaded")
        # ... while tenant B still gets in; then the queue is full for everyone.
        queued_b = asyncio.create_task(post("/v1/decisions", headers=b,
                                            json=decision_request()))
        await _until(lambda: writer.depth == 2)
        _assert_problem(await post("/v1/decisions", headers=c, json=decision_request()),
                        503, "overloaded")
    # Right after (within COSIGNER_OVERLOAD_HOLD_S): not ready, so a balancer steers away.
    ready = await harness.client.get("/readyz")
    assert ready.status_code == 503 and int(ready.headers["retry-after"]) >= 1
    assert ready.json()["checks"] == {"database": True, "policies": True,
                                      "log_writer": True, "not_overloaded": False}
    answered = await asyncio.gather(first, queued_a, queued_b)
    assert [r.status_code for r in answered] == [200, 200, 200]
    async with harness.db.read() as conn:
        logged = set((await conn.execute(select(audit_events.c.decision_id).where(
            audit_events.c.type == "decision.made"))).scalars().all())
    assert {r.json()["decision_id"] for r in answered} <= logged
    assert harness.context.shedding.counts["decisions"] == 2


async def test_long_polls_per_credential_are_bounded(
        harness_factory: Callable[..., Awaitable[Harness]], tenant: str) -> None:
    harness = await harness_factory(long_polls_per_credential=1)
    runtime = await harness.headers(tenant, "runtime")
    finance = await harness.headers(tenant, "finance", subject="fin-1")
    opened = (await harness.client.post("/v1/decisions", headers=runtime, json=decision_request(
        args=APPROVAL_ARGS))).json()
    path = f"/v1/approvals/{opened['approval']['id']}"
    polling = asyncio.create_task(harness.client.get(path, headers=runtime,
                                                     params={"wait": 20}))
    await _until(lambda: bool(harness.context.long_polls))
    _assert_problem(await harness.client.get(path, headers=runtime, params={"wait": 5}),
                    503, "overloaded")
    # A plain read is no long-poll; another credential has its own bound.
    assert (await harness.client.get(path, headers=runtime)).status_code == 200
    reviewed = await harness.client.post(path + "/reviews", headers=finance, json={
        "decision": "approved", "comment": "checked the ledger"})
    assert reviewed.status_code == 200, reviewed.text
    assert (await polling).json()["status"] == "approved"
    assert harness.context.long_polls == {}
    assert (await harness.client.get("/readyz")).json()["checks"]["not_overloaded"] is False


async def test_webhook_backlog_bound_stops_new_approval_requests(
        harness_factory: Callable[..., Awaitable[Harness]], tenant: str) -> None:
    receiver = {"url": "http://127.0.0.1:9/hook", "secret": "s" * 32}  # refuses: stays due
    harness = await harness_factory(webhooks={"*": [receiver]}, webhook_backlog_max=1)
    headers = await harness.headers(tenant, "runtime")
    first = await harness.client.post("/v1/decisions", headers=headers, json=decision_request(
        run={"id": "run-a"}, args=APPROVAL_ARGS))
    assert first.json()["effect"] == "require_approval"
    worker = harness.tasks.webhook_worker
    assert worker is not None
    await worker.stop_loop()
    await worker.run_once()  # counts the backlog (1), the attempt fails and stays pending
    refused = await harness.client.post("/v1/decisions", headers=headers,
                                        json=decision_request(run={"id": "run-b"},
                                                              args=APPROVAL_ARGS))
    _assert_problem(refused, 503, "overloaded")
    # Calls that open no approval request are still decided.
    assert (await harness.client.post("/v1/decisions", headers=headers,
                                      json=decision_request())).status_code == 200
