"""The hot routes as a raw ASGI endpoint, ahead of FastAPI's router (issue 20).

``POST /v1/decisions`` and ``POST /v1/permits/redeem`` are answered here, without
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
  ``content-type: application/json`` — the bytes ``json_response`` sends.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from cosigner.context import AppContext
from cosigner.core.errors import CosignerError
from cosigner.http import problems
from cosigner.http.body import receive_body
from cosigner.http.deps import authenticate_header
from cosigner.http.ratelimit import CALLER_STATE
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


class HotRoutes:
    """Pure ASGI middleware serving :data:`HOT_ROUTES` (``POST`` only); see the module
    docstring. ``served`` counts the requests it answered (tests prove the lean path is
    the one serving)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.served = 0
        self._routes: dict[str, Any] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] == "POST"
                and scope["path"] in HOT_ROUTES and not scope.get("root_path")):
            await self._serve(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _route(self, path: str) -> Any:
        """The FastAPI route declared for this path (for the span name, as the router
        would set it)."""
        if self._routes is None:
            self._routes = {r.path: r for r in (*decisions_routes.router.routes,
                                                *permits_routes.router.routes)
                            if isinstance(r, APIRoute) and "POST" in r.methods}
        return self._routes.get(path)

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
        try:
            caller = await authenticate_header(ctx, authorization, admitted,
                                               decision=decision)
            body = await handler(ctx, caller, lambda: receive_body(receive, declared, limit))
            content = orjson.dumps(body)
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
