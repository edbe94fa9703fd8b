"""Structured logs: JSON lines with the request's context (README § Operations, Logs).

Each line: ``timestamp`` (UTC, RFC 3339, ms), ``level``, ``logger``, ``message``, and
``request_id``, ``tenant``, ``decision_id``, ``trace_id`` when the line was written while
serving a request that had them (context variables set by the HTTP middleware, the
authenticator and the decision use case). ``exc_info`` adds ``exception`` (the traceback).

What goes in is what the code logs: messages never carry argument values, API keys or
secrets (tests/http/test_logs.py sends a canary value through a live server and looks for
it in the log file).
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Literal

from cosigner.core import tracing

request_id: ContextVar[str | None] = ContextVar("cosigner_request_id", default=None)
tenant: ContextVar[str | None] = ContextVar("cosigner_tenant", default=None)
decision_id: ContextVar[str | None] = ContextVar("cosigner_decision_id", default=None)

LogFormat = Literal["json", "plain"]


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, object] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, var in (("request_id", request_id), ("tenant", tenant),
                         ("decision_id", decision_id)):
            value = var.get()
            if value is not None:
                body[key] = value
        trace_id = tracing.current_trace_id()
        if trace_id is not None:
            body["trace_id"] = trace_id
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False, default=str)


class PlainFormatter(logging.Formatter):
    """``timestamp level logger: message [request_id=... decision_id=...]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = [f"{key}={var.get()}" for key, var in (
            ("request_id", request_id), ("tenant", tenant), ("decision_id", decision_id))
            if var.get() is not None]
        return f"{line} [{' '.join(extra)}]" if extra else line


def configure(*, level: str, fmt: LogFormat) -> None:
    """Send every logger (uvicorn's too) to stderr in ``fmt`` at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        named = logging.getLogger(name)
        named.handlers.clear()
        named.propagate = True
    logging.getLogger("alembic").setLevel(logging.WARNING)
