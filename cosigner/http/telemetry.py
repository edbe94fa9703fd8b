"""Per-request telemetry: request id, the HTTP server span, the optional access log.

A pure ASGI middleware (no response buffering). The request id is the caller's
``X-Request-ID`` when it is short and plain (``[A-Za-z0-9._-]{1,64}``), else a new one; it is
echoed in the response and set for every log line of the request
(:mod:`cosigner.core.logs`). With tracing on, a W3C ``traceparent`` from the caller is the
span's parent, so an agent step and its decision are one trace.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cosigner.core import logs, tracing

access_log = logging.getLogger("cosigner.access")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class RequestTelemetry:
    """Set the request's log context and server span; write one access line if asked."""

    def __init__(self, app: ASGIApp, *, access: bool = False) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(first_header(scope, b"x-request-id"))
        tokens = (logs.request_id.set(rid), logs.tenant.set(None), logs.decision_id.set(None))
        status = 500
        rid_header = (b"x-request-id", rid.encode())

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), rid_header]
            await send(message)

        started = time.perf_counter()
        try:
            if tracing.enabled():
                await self._traced(scope, receive, send_wrapper)
            else:
                await self.app(scope, receive, send_wrapper)
        finally:
            if self.access:
                log_access(scope, status, started)
            logs.request_id.reset(tokens[0])
            logs.tenant.reset(tokens[1])
            logs.decision_id.reset(tokens[2])

    async def _traced(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        parent = tracing.extract(headers)
        method = scope["method"]
        with tracing.span(f"{method}", {"http.request.method": method,
                                        "url.path": scope["path"]},
                          context=parent, server=True) as current:
            status: dict[str, Any] = {}

            async def send_status(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status["code"] = message["status"]
                await send(message)

            try:
                await self.app(scope, receive, send_status)
            finally:
                route = scope.get("route")
                template = getattr(route, "path", None)
                if template:
                    current.update_name(f"{method} {template}")
                    current.set_attribute("http.route", template)
                if "code" in status:
                    current.set_attribute("http.response.status_code", status["code"])


def request_id(given: bytes | None) -> str:
    """The request id: ``given`` (the caller's first ``X-Request-ID``) when it is short
    and plain (``[A-Za-z0-9._-]{1,64}``), else a new random one (a version-4 UUID's 32 hex
    digits, as ``uuid.uuid4().hex``; :func:`random_ids`)."""
    if given is not None and _REQUEST_ID.fullmatch(text := given.decode("latin-1")):
        return text
    try:
        return _fresh.pop()
    except IndexError:
        _fresh.extend(random_ids(os.urandom(16 * _BATCH)))
        return _fresh.pop()


#: New request ids are made this many at a time: one ``os.urandom`` call (a system call,
#: ~0.4 µs, more under a sandboxing kernel) per batch instead of one per request.
_BATCH = 256
#: Ids made and not handed out yet (``list.pop`` is atomic: no two requests share one).
#: A forked child starts without them, so it never repeats its parent's.
_fresh: list[str] = []
os.register_at_fork(after_in_child=_fresh.clear)


def random_ids(raw: bytes) -> list[str]:
    """``uuid.UUID(bytes=chunk, version=4).hex`` of each 16-byte ``chunk`` of ``raw``
    (``len(raw)`` a multiple of 16): the version and variant bits set (RFC 9562 §5.4),
    the other 122 bits ``raw``'s own."""
    fixed = bytearray(raw)
    fixed[6::16] = bytes(b & 0x0F | 0x40 for b in fixed[6::16])  # version 4
    fixed[8::16] = bytes(b & 0x3F | 0x80 for b in fixed[8::16])  # variant 10
    text = fixed.hex()
    return [text[at:at + 32] for at in range(0, len(text), 32)]


def log_access(scope: Scope, status: int, started: float) -> None:
    """The access line of a request answered ``status`` (500 when nothing was sent),
    ``started`` at ``time.perf_counter()``: ``METHOD path status N.Nms``."""
    access_log.info("%s %s %d %.1fms", scope["method"], scope["path"], status,
                    (time.perf_counter() - started) * 1000)


def log_refusal(scope: Scope, status: int, started: float, rid: str,
                tenant: str | None) -> None:
    """The access line of a request refused ahead of :class:`RequestTelemetry` (the
    rate-limit door's 429, :mod:`cosigner.http.ratelimit` and :mod:`cosigner.http.edge`),
    written as an answered request's is: in the request's log context, its request id
    ``rid`` (:func:`request_id` of the caller's first ``X-Request-ID``: the id the
    refusal's ``X-Request-ID`` header carries) and ``tenant`` (the refused caller's), so
    every refusal is logged like an allow."""
    tokens = (logs.request_id.set(rid), logs.tenant.set(tenant),
              logs.decision_id.set(None))
    try:
        log_access(scope, status, started)
    finally:
        logs.request_id.reset(tokens[0])
        logs.tenant.reset(tokens[1])
        logs.decision_id.reset(tokens[2])


def first_header(scope: Scope, name: bytes) -> bytes | None:
    """The value of the request's first header ``name`` (lower case), or ``None``."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None
