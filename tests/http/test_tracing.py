"""OpenTelemetry spans of one agent step through the Python client (issue 21): the client
sends the step's ``traceparent``, the server's spans are its children, and the decision id
and trace id are in both the span and the decision-log event."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from cosigner_client import AsyncGate
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import select

from cosigner.core import tracing
from cosigner.db.tables import audit_events
from tests.conftest import Harness

REFUND = {"order_id": "ord_8472", "amount_minor": 5000, "currency": "USD",
          "reason_code": "duplicate_charge"}


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    try:
        yield provider, exporter
    finally:
        tracing.disable()


async def test_one_agent_step_is_one_trace(harness: Harness, tenant: str,
                                           spans: tuple[TracerProvider, Any]) -> None:
    provider, exporter = spans
    key = await harness.key(tenant, "runtime")
    transport = httpx.ASGITransport(app=harness.app)
    async with AsyncGate("http://cosigner.test", key, transport=transport, run="run-trace",
                         principal={"id": "customer-42", "type": "customer"},
                         initiator={"id": "agent-support", "type": "agent"}) as gate:
        with provider.get_tracer("agent").start_as_current_span("agent.step") as step:
            decision = await gate.decide("issue_refund", REFUND)
            assert decision.effect == "allow" and decision.permit is not None
            redemption = await gate.redeem(decision.permit, "issue_refund", REFUND)
    assert redemption.ok
    trace_id = step.get_span_context().trace_id
    finished = exporter.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for span in finished:
        by_name.setdefault(span.name, []).append(span)
    assert {s.context.trace_id for s in finished} == {trace_id}  # one trace

    (http,) = by_name["POST /v1/decisions"]
    assert http.parent.span_id == step.get_span_context().span_id
    assert http.attributes["cosigner.decision_id"] == decision.decision_id
    assert http.attributes["cosigner.effect"] == "allow"
    assert http.attributes["http.response.status_code"] == 200
    children = {s.name: s for s in finished if s.parent is not None
                and s.parent.span_id == http.context.span_id}
    assert children["authenticate"].attributes["cosigner.tenant"] == tenant
    evaluation = children["policy.evaluate"].attributes
    assert (evaluation["cosigner.bundle"], evaluation["cosigner.engine"],
            evaluation["cosigner.effect"]) == ("refunds", "python", "allow")
    assert children["decision_log.write"].attributes["cosigner.batch_size"] >= 1

    (redeem_http,) = by_name["POST /v1/permits/redeem"]
    assert redeem_http.parent.span_id == step.get_span_context().span_id
    (redeem,) = by_name["permit.redeem"]
    assert redeem.parent.span_id == redeem_http.context.span_id
    assert redeem.attributes["cosigner.outcome"] == "redeemed"
    assert redeem.attributes["cosigner.decision_id"] == decision.decision_id

    async with harness.db.read() as conn:
        body = (await conn.execute(select(audit_events.c.body).where(
            audit_events.c.decision_id == decision.decision_id,
            audit_events.c.type == "decision.made"))).scalar_one()
    assert json.loads(body)["payload"]["trace_id"] == format(trace_id, "032x")


async def test_no_spans_and_no_trace_id_when_off(harness: Harness, tenant: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    key = await harness.key(tenant, "runtime")
    transport = httpx.ASGITransport(app=harness.app)
    async with AsyncGate("http://cosigner.test", key, transport=transport, run="run-off",
                         principal="customer-42", initiator="agent-support") as gate:
        with provider.get_tracer("agent").start_as_current_span("agent.step"):
            decision = await gate.decide("issue_refund", REFUND)
    assert [s.name for s in exporter.get_finished_spans()] == ["agent.step"]
    async with harness.db.read() as conn:
        body = (await conn.execute(select(audit_events.c.body).where(
            audit_events.c.decision_id == decision.decision_id,
            audit_events.c.type == "decision.made"))).scalar_one()
    assert "trace_id" not in json.loads(body)["payload"]
