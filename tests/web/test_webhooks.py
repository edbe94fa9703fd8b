"""Approval webhooks: queued with the approval event, signed, retried, never blocking."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.core.clock import numeric_date
from cosigner.core.metrics import metrics
from cosigner.db.tables_web import webhook_attempts, webhook_deliveries
from cosigner.webhooks import signing
from cosigner.webhooks.worker import MAX_ATTEMPTS, backoff_s
from tests.conftest import ROOT
from tests.web.conftest import message_request, refund_request, review_bundle

SECRET = "whsec-0123456789abcdef"


class Receiver:
    """A real HTTP receiver on loopback; answers with ``statuses`` in turn (then 200)."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


async def _app(harness_factory: Any, tenant: str, url: str, tmp_path: Path) -> Any:
    h = await harness_factory(
        webhooks={tenant: [{"url": url, "secret": SECRET}]},
        bundle_dirs=[ROOT / "policies", review_bundle(tmp_path, tenant)])
    await h.tasks.webhook_worker.stop_loop()  # the test drives run_once
    return h


async def _deliveries(h: Any, tenant: str) -> list[Any]:
    async with h.db.read() as conn:
        return list((await conn.execute(select(webhook_deliveries)
                                        .where(webhook_deliveries.c.tenant == tenant)
                                        .order_by(webhook_deliveries.c.created_at))).all())


async def _make_due(h: Any, tenant: str) -> None:
    async with h.db.transaction() as conn:
        await conn.execute(webhook_deliveries.update()
                           .where(webhook_deliveries.c.tenant == tenant)
                           .values(next_attempt_at=h.context.clock(),
                                   claimed_until=None))


async def _attempts(h: Any, tenant: str) -> list[Any]:
    async with h.db.read() as conn:
        return list((await conn.execute(
            select(webhook_attempts.c.attempt, webhook_attempts.c.status_code,
                   webhook_attempts.c.error)
            .join(webhook_deliveries,
                  webhook_deliveries.c.id == webhook_attempts.c.delivery_id)
            .where(webhook_deliveries.c.tenant == tenant)
            .order_by(webhook_attempts.c.attempt))).all())


async def test_pending_and_decided_are_signed_with_masked_args(
        harness_factory: Any, tenant: str, receiver: Receiver, tmp_path: Path) -> None:
    h = await _app(harness_factory, tenant, receiver.url, tmp_path)
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    decision = (await h.client.post("/v1/decisions", headers=runtime, json=message_request(
        card_number="4111111111111111"))).json()
    approval_id = decision["approval"]["id"]
    worker = h.tasks.webhook_worker
    await worker.run_once()
    fiona = await h.headers(tenant, "finance", subject="fiona")
    reviewed = await h.client.post(f"/v1/approvals/{approval_id}/reviews", headers=fiona,
                                   json={"decision": "approved", "comment": "fine"})
    assert reviewed.status_code == 200, reviewed.text
    await worker.run_once()
    bodies = [json.loads(body) for _, body in receiver.calls]
    assert [b["type"] for b in bodies] == ["approval.pending", "approval.decided"]
    for headers, raw in receiver.calls:
        assert signing.verify(SECRET, raw, headers["cosigner-signature"],
                              now=numeric_date(h.context.clock()))
        assert not signing.verify("another-secret-value", raw, headers["cosigner-signature"],
                                  now=numeric_date(h.context.clock()))
        assert b"4111111111111111" not in raw
    first = bodies[0]
    assert first["approval"]["id"] == approval_id and first["approval"]["tool"] == "send_message"
    assert first["approval"]["args"]["card_number"] == "•••"
    assert first["links"]["detail"].endswith(f"/ui/approvals/{approval_id}")
    assert bodies[1]["approval"]["status"] == "approved"
    assert all(d.status == "delivered" for d in await _deliveries(h, tenant))


async def test_failing_receiver_is_retried_with_backoff_and_never_blocks(
        harness_factory: Any, tenant: str, receiver: Receiver, tmp_path: Path) -> None:
    receiver.statuses = [500, 503]
    before = {status: _delivery_count(status) for status in ("retry", "delivered")}
    h = await _app(harness_factory, tenant, receiver.url, tmp_path)
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    decision = await h.client.post("/v1/decisions", headers=runtime, json=message_request())
    assert decision.status_code == 200  # queued, not sent: the decision never waits on it
    worker = h.tasks.webhook_worker
    await worker.run_once()
    [row] = await _deliveries(h, tenant)
    assert row.status == "pending" and row.attempts == 1
    assert await worker.run_once() == 0  # not due yet: backoff
    await _make_due(h, tenant)  # instead of waiting out the backoff
    await worker.run_once()
    await _make_due(h, tenant)
    await worker.run_once()
    [row] = await _deliveries(h, tenant)
    assert row.status == "delivered" and row.attempts == 3
    attempts = await _attempts(h, tenant)
    assert [(a.attempt, a.status_code) for a in attempts] == [(1, 500), (2, 503), (3, 200)]
    assert len(receiver.calls) == 3
    assert {status: _delivery_count(status) - count for status, count in before.items()} == {
        "retry": 2, "delivered": 1}  # cosigner_webhook_deliveries_total


def _delivery_count(status: str) -> float:
    value = metrics().registry.get_sample_value("cosigner_webhook_deliveries_total",
                                                {"status": status})
    return value or 0.0


async def test_unreachable_receiver_gives_up_after_max_attempts(
        harness_factory: Any, tenant: str, tmp_path: Path) -> None:
    h = await _app(harness_factory, tenant, "http://127.0.0.1:9/hook", tmp_path)
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    await h.client.post("/v1/decisions", headers=runtime, json=message_request())
    worker = h.tasks.webhook_worker
    for _ in range(MAX_ATTEMPTS):
        await _make_due(h, tenant)
        await worker.run_once()
    [row] = await _deliveries(h, tenant)
    assert row.status == "failed" and row.attempts == MAX_ATTEMPTS
    attempts = await _attempts(h, tenant)
    assert len(attempts) == MAX_ATTEMPTS and all(a.error for a in attempts)


async def test_no_webhooks_for_tenants_without_receivers(
        harness_factory: Any, tenant: str, receiver: Receiver) -> None:
    h = await harness_factory(webhooks={"someone-else": [{"url": receiver.url,
                                                          "secret": SECRET}]})
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    await h.client.post("/v1/decisions", headers=runtime, json=refund_request())
    assert await _deliveries(h, tenant) == []


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 16.0]
    assert backoff_s(30) == 900.0


def test_signature_refuses_stale_timestamps() -> None:
    header = signing.sign(SECRET, b"{}", timestamp=1000)
    assert signing.verify(SECRET, b"{}", header, now=1100)
    assert not signing.verify(SECRET, b"{}", header, now=1000 + 301)
    assert not signing.verify(SECRET, b"{ }", header, now=1000)


