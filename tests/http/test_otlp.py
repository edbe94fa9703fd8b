"""Traces leave a live ``cosigner serve`` over OTLP/HTTP when the standard ``OTEL_*``
variables ask for them (issue 21): a receiver started here gets the decision's spans, in
the caller's trace, with the decision id."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import start_module_server
from tests.http.approval_helpers import scripted, write_scripted_bundle
from tests.http.test_metrics import keys


class Receiver(BaseHTTPRequestHandler):
    """OTLP/HTTP traces endpoint keeping every span it is sent."""

    spans: list[Any] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    type(self).spans.extend(scope.spans)
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        return None


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.spans = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_spans_reach_an_otlp_receiver(receiver: str, tmp_path: Path, db_kind: str,
                                      pg_url: str | None, sqlite_template: Path,
                                      tenant: str) -> None:
    bundles = write_scripted_bundle(tmp_path / "bundles")
    server, database_url = start_module_server(
        tmp_path, db_kind=db_kind, pg_url=pg_url, sqlite_template=sqlite_template,
        bundle_dirs=[bundles], OTEL_EXPORTER_OTLP_ENDPOINT=receiver,
        OTEL_BSP_SCHEDULE_DELAY="50", OTEL_SERVICE_NAME="cosigner-test")
    try:
        runtime = keys(database_url, tenant)["runtime"]
        trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        resp = httpx.post(server.url + "/v1/decisions", timeout=10, json=scripted(
            {"effect": "allow", "reasons": ["fine"]}), headers={
            "Authorization": f"Bearer {runtime}",
            "traceparent": f"00-{trace_id}-{parent_id}-01"})
        assert resp.status_code == 200, resp.text
        decision_id = resp.json()["decision_id"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                s.name == "POST /v1/decisions" for s in Receiver.spans):
            time.sleep(0.05)
    finally:
        server.stop()
    ours = [s for s in Receiver.spans if s.trace_id.hex() == trace_id]
    # One span per step: no second HTTP span from the framework's own instrumentation.
    assert sorted(s.name for s in ours) == ["POST /v1/decisions", "authenticate",
                                            "decision_log.write", "policy.evaluate"]
    by_name = {s.name: s for s in ours}
    http = by_name["POST /v1/decisions"]
    assert http.trace_id.hex() == trace_id and http.parent_span_id.hex() == parent_id
    attributes = {a.key: a.value.string_value for a in http.attributes}
    assert attributes["cosigner.decision_id"] == decision_id
    for child in ("authenticate", "policy.evaluate", "decision_log.write"):
        assert by_name[child].parent_span_id == http.span_id
