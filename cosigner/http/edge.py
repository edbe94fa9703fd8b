"""The hot routes served from the outermost ASGI callable, ahead of Starlette (issue 20).

:class:`CosignerAPI` is the app :func:`cosigner.app.create_app` returns: a FastAPI app
whose ``__call__`` hands ``POST /v1/decisions``, ``POST /v1/permits/redeem`` and the
long-poll read ``GET /v1/approvals/{id}?wait=`` (what :mod:`cosigner.http.lean` takes)
to its :class:`Edge`, and everything else to FastAPI's middleware stack unchanged.

The edge does, in one function, what the stack does for these requests —
``ServerErrorMiddleware`` → ``TrustedProxies`` → ``RateLimit`` → ``RequestTelemetry`` →
``HotRoutes`` — without wrapping ``send`` at each layer: one scan of the headers, the
door's authentication from the key cache and its counts (a 429 there carries its request
id, as the stack's door does, and gets its access line under it like any answer:
:func:`log_refusal`), the request id (echoed last in the headers) and the log context,
the lean route (a request with more than one ``Authorization`` header is neither counted
at the door nor authenticated: the route refuses it, 401 ``unauthenticated``), one
``send`` for the start and one for the body, the access line, and the catch-all of anything raised
outside the route (logged, a 500 ``internal_error`` when nothing was sent yet, raised
on to the server). The answers, headers and log lines are the stack's
(tests/http/test_edge.py sends the same requests through both).

Left to the stack: requests while tracing is on (the server span is
``RequestTelemetry``'s), under a ``root_path``, and before the lifespan built the context.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from cosigner.core import logs, tracing
from cosigner.core.errors import RateLimited
from cosigner.http import lean, problems
from cosigner.http.proxies import ProxyRules
from cosigner.http.ratelimit import door_count, refuse
from cosigner.http.telemetry import log_access, log_refusal, request_id

log = logging.getLogger("cosigner.api")


class Edge:
    """Serves the hot routes of one app (see the module docstring). ``served`` counts the
    requests it answered."""

    def __init__(self, *, trusted: Iterable[str], access: bool) -> None:
        self.proxies = ProxyRules(trusted=trusted)
        self.access = access
        self.served = 0

    async def serve(self, scope: Scope, receive: Receive, send: Send, ctx: Any,
                    poll: tuple[str, float] | None) -> None:
        """Answer a hot request: ``POST`` of a :data:`lean.HOT_ROUTES` path, or the
        long-poll read ``poll`` = ``(approval_id, wait_s)``; ``ctx`` is the app context."""
        self.served += 1
        scope = self.proxies.apply(scope)
        auth = given = declared = None
        several = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                if auth is None:
                    auth = value
                else:
                    several = True
            elif name == b"content-length":
                declared = value
            elif name == b"x-request-id" and given is None:
                given = value
        status: int | None = None  # of the response start, once sent
        started = time.perf_counter()
        try:
            path = scope["path"]
            admitted, refused = door_count(ctx, None if several else auth,
                                           decision=poll is None and path == "/v1/decisions")
            if refused is not None:  # as RateLimit: recorded, then the 429
                assert admitted is not None
                try:
                    await ctx.quotas.refuse(admitted, refused)
                except RateLimited as exc:
                    status = 429
                    rid = request_id(given)
                    await refuse(send, exc, rid)
                    if self.access:
                        log_refusal(scope, 429, started, rid, admitted.tenant)
                    return
            rid = request_id(given)
            tokens = (logs.request_id.set(rid), logs.tenant.set(None),
                      logs.decision_id.set(None))
            try:
                header = None if several else auth or b""
                if poll is None:
                    scope["route"] = lean.route_for(path)
                    answer = await lean.post(ctx, path, header, admitted, receive, declared)
                else:
                    scope["route"] = lean.route_for(lean.APPROVAL_TEMPLATE)
                    answer = await lean.respond(
                        lean.read_approval(ctx, header, admitted, *poll))
                if answer is not None:
                    status, headers, body = answer
                    headers.append((b"x-request-id", rid.encode()))
                    await send({"type": "http.response.start", "status": status,
                                "headers": headers})
                    await send({"type": "http.response.body", "body": body})
            finally:
                if self.access:
                    log_access(scope, 500 if status is None else status, started)
                logs.request_id.reset(tokens[0])
                logs.tenant.reset(tokens[1])
                logs.decision_id.reset(tokens[2])
        except Exception as exc:  # as ServerErrorMiddleware with the app's 500 handler
            log.exception("unhandled error", exc_info=exc)
            if status is None:
                await problems.problem(500, "internal_error", "Internal error",
                                       "internal error; see server log")(scope, receive, send)
            raise


class CosignerAPI(FastAPI):
    """FastAPI with the hot routes answered by :attr:`edge` before Starlette's stack;
    ``edge = None`` sends every request through the stack."""

    edge: Edge | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        edge = self.edge
        if edge is not None and scope["type"] == "http" and not self.root_path \
                and not scope.get("root_path") and not tracing.enabled():
            method = scope["method"]
            poll = None
            if (method == "POST" and scope["path"] in lean.HOT_ROUTES) or (
                    method == "GET" and (poll := lean.long_poll_args(scope)) is not None):
                ctx = self.state._state.get("context")  # State.__getattr__, without its frame
                if ctx is not None:
                    await edge.serve(scope, receive, send, ctx, poll)
                    return
        await super().__call__(scope, receive, send)

