"""The hot routes as a raw ASGI endpoint, ahead of FastAPI's router (issue 20).

``POST /v1/decisions``, ``POST /v1/permits/redeem`` and the long-poll read
``GET /v1/approvals/{approval_id}?wait=s`` are answered here, without
FastAPI's routing, ``Request`` objects, dependency resolution and exception-handler
machinery (~120 µs of CPU per request on the bench machine, more than the decision's own
compute). Everything else goes on to FastAPI.

Same wire and same guarantees as the FastAPI routes, which stay declared (OpenAPI
documents them; they serve these paths only when this middleware steps aside, under a
``root_path`` mount):

* It sits inside every other middleware of :func:`cosigner.app.create_app`
  (``TrustedProxies`` → ``RateLimit`` → ``RequestTelemetry`` → here), so the client
  address, rate limits at the door, the request id, the server span and the access log
  apply as before; ``scope["route"]`` is set to the FastAPI route so the span is named
  ``POST /v1/decisions`` as before.
* Authentication, quotas and the decision quota are
  :func:`cosigner.http.deps.authenticate_header` (the FastAPI dependency's own code); the
  body limit, strict JSON, the wire model and the use case are
  :func:`cosigner.http.routes.decisions.decide_body` and
  :func:`cosigner.http.routes.permits.redeem_body`, which the FastAPI routes run too.
* Errors are the same RFC 9457 documents (:func:`cosigner.http.problems.to_response`);
  anything unexpected is logged and answered as the same 500 ``internal_error``.
* The answer is the use case's object as compact JSON (orjson), ``content-length`` then
  ``content-type: application/json`` — the bytes ``json_response`` sends. The approval
  read is serialised through its route's response model by FastAPI's own
  ``serialize_response``, as the route would.
* The approval read takes only what the FastAPI route's parameters accept without doubt
  (an id of 1–64 ``[A-Za-z0-9_-]``, at most one ``wait`` written as plain decimal ≤ 60);
  anything else goes on to FastAPI, which answers its own 422 for what it refuses.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

import orjson
from fastapi.routing import APIRoute, serialize_response
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from cosigner.approvals import queries as approval_queries
from cosigner.context import AppContext
from cosigner.core.errors import CosignerError
from cosigner.http import problems
from cosigner.http.body import receive_body
from cosigner.http.deps import authenticate_header
from cosigner.http.ratelimit import CALLER_STATE
from cosigner.http.routes import approvals as approvals_routes
from cosigner.http.routes import decisions as decisions_routes
from cosigner.http.routes import permits as permits_routes
from cosigner.identity.principals import Caller

log = logging.getLogger("cosigner.api")

Handler = Callable[[AppContext, Caller, Callable[[], Awaitable[bytes]]],
                   Awaitable[dict[str, Any]]]

#: Path → (handler, is a decision: counted against the tenant's decision quota).
HOT_ROUTES: dict[str, tuple[Handler, bool]] = {
    "/v1/decisions": (decisions_routes.decide_body, True),
    "/v1/permits/redeem": (permits_routes.redeem_body, False),
}
_JSON = (b"content-type", b"application/json")
#: ``GET /v1/approvals/{approval_id}``: the id as its path parameter accepts it.
_APPROVAL = re.compile(r"/v1/approvals/([A-Za-z0-9_-]{1,64})")
_APPROVAL_TEMPLATE = "/v1/approvals/{approval_id}"
#: ``wait`` as a plain decimal (the route's ``Query(0, ge=0, le=60)`` also allows 60).
_WAIT = re.compile(r"[0-9]{1,2}(?:\.[0-9]{1,6})?")


def long_poll_args(scope: Scope) -> tuple[str, float] | None:
    """``(approval_id, wait_s)`` of a ``GET /v1/approvals/{approval_id}`` that the FastAPI
    route would accept as is, else ``None`` (FastAPI serves it)."""
    found = _APPROVAL.fullmatch(scope["path"])
    if found is None:
        return None
    waits = [v for k, v in parse_qsl(scope["query_string"].decode("latin-1"),
                                      keep_blank_values=True) if k == "wait"]
    if not waits:
        return found.group(1), 0.0
    if len(waits) > 1 or not _WAIT.fullmatch(waits[0]) or float(waits[0]) > 60:
        return None
    return found.group(1), float(waits[0])


class HotRoutes:
    """Pure ASGI middleware serving :data:`HOT_ROUTES` (``POST`` only); see the module
    docstring. ``served`` counts the requests it answered (tests prove the lean path is
    the one serving)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.served = 0
        self._routes: dict[str, Any] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            if scope["method"] == "POST" and scope["path"] in HOT_ROUTES:
                await self._serve(scope, receive, send)
                return
            if scope["method"] == "GET" and (poll := long_poll_args(scope)) is not None:
                await self._serve_read(scope, receive, send, *poll)
                return
        await self.app(scope, receive, send)

    def _route(self, path: str) -> Any:
        """The FastAPI route declared for this path (for the span name, as the router
        would set it)."""
        if self._routes is None:
            self._routes = {r.path: r for r in (*decisions_routes.router.routes,
                                                *permits_routes.router.routes)
                            if isinstance(r, APIRoute) and "POST" in (r.methods or ())}
            self._routes[_APPROVAL_TEMPLATE] = next(
                r for r in approvals_routes.router.routes if isinstance(r, APIRoute)
                and r.path == _APPROVAL_TEMPLATE and "GET" in (r.methods or ()))
        return self._routes.get(path)

    async def _serve_read(self, scope: Scope, receive: Receive, send: Send,
                          approval_id: str, wait_s: float) -> None:
        """The long-poll read of one approval request (see the module docstring)."""
        self.served += 1
        route = self._route(_APPROVAL_TEMPLATE)
        scope["route"] = route
        ctx: AppContext = scope["app"].state.context
        authorization = next((value.decode("latin-1") for name, value in scope["headers"]
                              if name == b"authorization"), "")
        admitted = scope["state"].get(CALLER_STATE) if "state" in scope else None

        async def produce() -> bytes:
            caller = await authenticate_header(ctx, authorization, admitted, decision=False)
            state = await approval_queries.get_state(ctx, caller, approval_id,
                                                     wait_s=wait_s)
            return bytes(await serialize_response(
                field=route.response_field, response_content=state,
                include=route.response_model_include, exclude=route.response_model_exclude,
                by_alias=route.response_model_by_alias,
                exclude_unset=route.response_model_exclude_unset,
                exclude_defaults=route.response_model_exclude_defaults,
                exclude_none=route.response_model_exclude_none, dump_json=True))

        await _answer(scope, receive, send, produce)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.served += 1
        path = scope["path"]
        handler, decision = HOT_ROUTES[path]
        route = self._route(path)
        if route is not None:
            scope["route"] = route
        ctx: AppContext = scope["app"].state.context
        authorization = ""
        declared: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"content-length":
                declared = value
        admitted = scope["state"].get(CALLER_STATE) if "state" in scope else None
        limit = ctx.settings.max_body_bytes

        async def produce() -> bytes:
            caller = await authenticate_header(ctx, authorization, admitted,
                                               decision=decision)
            body = await handler(ctx, caller, lambda: receive_body(receive, declared, limit))
            return orjson.dumps(body)

        await _answer(scope, receive, send, produce)


async def _answer(scope: Scope, receive: Receive, send: Send,
                  produce: Callable[[], Awaitable[bytes]]) -> None:
    """Send ``await produce()`` as a 200 JSON answer; a :class:`CosignerError` as its
    RFC 9457 problem, anything else as the FastAPI app's 500 ``internal_error``; a client
    gone before its body arrived gets nothing."""
    try:
        content = await produce()
    except CosignerError as exc:
        await problems.to_response(exc)(scope, receive, send)
        return
    except ClientDisconnect:
        return  # nobody to answer
    except Exception as exc:  # as the FastAPI app's catch-all handler
        log.exception("unhandled error", exc_info=exc)
        await problems.problem(500, "internal_error", "Internal error",
                               "internal error; see server log")(scope, receive, send)
        return
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-length", str(len(content)).encode()), _JSON]})
    await send({"type": "http.response.body", "body": content})
