"""Log line formats (README § Metrics, traces and logs): JSON objects with the request's
context, or plain text."""

from __future__ import annotations

import json
import logging

from cosigner.core import logs


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("cosigner.decisions", logging.WARNING, __file__, 1, message,
                             None, None)


def test_json_line_carries_the_request_context() -> None:
    tokens = (logs.request_id.set("rid-1"), logs.tenant.set("acme"),
              logs.decision_id.set("d-1"))
    try:
        line = logs.JsonFormatter().format(_record("slow policy"))
    finally:
        logs.request_id.reset(tokens[0])
        logs.tenant.reset(tokens[1])
        logs.decision_id.reset(tokens[2])
    body = json.loads(line)
    assert body["timestamp"].endswith("Z") and body["level"] == "warning"
    assert (body["logger"], body["message"]) == ("cosigner.decisions", "slow policy")
    assert (body["request_id"], body["tenant"], body["decision_id"]) == ("rid-1", "acme", "d-1")
    assert "trace_id" not in body  # tracing off


def test_json_line_without_a_request_has_no_context_keys() -> None:
    body = json.loads(logs.JsonFormatter().format(_record("started")))
    assert set(body) == {"timestamp", "level", "logger", "message"}


def test_plain_line() -> None:
    token = logs.request_id.set("rid-2")
    try:
        line = logs.PlainFormatter().format(_record("hello"))
    finally:
        logs.request_id.reset(token)
    assert line.endswith("WARNING cosigner.decisions: hello [request_id=rid-2]")
