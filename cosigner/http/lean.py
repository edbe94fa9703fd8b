"""The hot routes as a raw ASGI endpoint, ahead of FastAPI's router (issue 20).

``POST /v1/decisions``, ``POST /v1/permits/redeem`` and the long-poll read
``GET /v1/approvals/{approval_id}?wait=s`` are answered here, without
FastAPI's routing, ``Request`` objects, dependency resolution and exception-handler
machinery (~120 µs of CPU per request on the bench machine, more than the decision's own
compute). Everything else goes on to FastAPI.

Same wire and same guarantees as the FastAPI routes, which stay declared (OpenAPI
documents them; they serve these paths only when this middleware steps aside, under a
``root_path`` mount):

* Served twice over, the same way: usually by the outermost edge
  (:mod:`cosigner.http.edge`), which does what ``TrustedProxies`` → ``RateLimit`` →
  ``RequestTelemetry`` do for these requests in one function; while tracing is on, by
  :class:`HotRoutes` inside that middleware stack (the server span is
  ``RequestTelemetry``'s). Either way the answer is :func:`post`'s (or
  :func:`read_approval`'s through :func:`respond`), and ``scope["route"]`` is set
  to the FastAPI route so the span is named ``POST /v1/decisions`` as before.
* Authentication, quotas and the decision quota are the door's (a caller it admitted
  is not parsed again) or :func:`cosigner.http.deps.authenticate_header` (the FastAPI
  dependency's own code); the body limit, strict JSON, the wire model and the use case
  are :func:`cosigner.http.routes.decisions.decide_body` and
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
from cosigner.core import logs
from cosigner.core.errors import CosignerError
from cosigner.http import problems
from cosigner.http.body import receive_body
from cosigner.http.deps import authenticate_header
from cosigner.http.ratelimit import CALLER_STATE, only_authorization
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
#: A hot route's answer: ``(status, headers, body)``.
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
#: ``GET /v1/approvals/{approval_id}``: the id as its path parameter accepts it.
_APPROVAL = re.compile(r"/v1/approvals/([A-Za-z0-9_-]{1,64})")
APPROVAL_TEMPLATE = "/v1/approvals/{approval_id}"
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


def route_for(path: str) -> Any:
    """The FastAPI route declared for a hot path (``POST`` paths of :data:`HOT_ROUTES`, or
    the approval read's template): for the span name, as the router would set it."""
    global _routes
    if _routes is None:
        found = {r.path: r for r in (*decisions_routes.router.routes,
                                     *permits_routes.router.routes)
                 if isinstance(r, APIRoute) and "POST" in (r.methods or ())}
        found[APPROVAL_TEMPLATE] = next(
            r for r in approvals_routes.router.routes if isinstance(r, APIRoute)
            and r.path == APPROVAL_TEMPLATE and "GET" in (r.methods or ()))
        _routes = found
    return _routes.get(path)


_routes: dict[str, Any] | None = None


class HotRoutes:
    """Pure ASGI middleware serving :data:`HOT_ROUTES` (``POST`` only) and the long-poll
    read inside the app's middleware stack: the path of requests the outermost edge
    (:mod:`cosigner.http.edge`) leaves to the stack (tracing on). ``served`` counts the
    requests it answered (tests prove the lean path is the one serving)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.served = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            work: Awaitable[Answer | None] | None = None
            if scope["method"] == "POST" and scope["path"] in HOT_ROUTES:
                work = self._post(scope, receive)
            elif scope["method"] == "GET" and (poll := long_poll_args(scope)) is not None:
                work = respond(self._read(scope, *poll))
            if work is not None:
                self.served += 1
                answer = await work
                if answer is not None:
                    await send({"type": "http.response.start", "status": answer[0],
                                "headers": answer[1]})
                    await send({"type": "http.response.body", "body": answer[2]})
                return
        await self.app(scope, receive, send)

    def _read(self, scope: Scope, approval_id: str, wait_s: float) -> Awaitable[bytes]:
        scope["route"] = route_for(APPROVAL_TEMPLATE)
        ctx: AppContext = scope["app"].state.context
        authorization = only_authorization(scope["headers"])
        admitted = scope["state"].get(CALLER_STATE) if "state" in scope else None
        return read_approval(ctx, authorization, admitted, approval_id, wait_s)

    def _post(self, scope: Scope, receive: Receive) -> Awaitable[Answer | None]:
        path = scope["path"]
        route = route_for(path)
        if route is not None:
            scope["route"] = route
        ctx: AppContext = scope["app"].state.context
        declared: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value
        authorization = only_authorization(scope["headers"])
        admitted = scope["state"].get(CALLER_STATE) if "state" in scope else None
        return post(ctx, path, authorization, admitted, receive, declared)


async def post(ctx: AppContext, path: str, authorization: bytes | None,
               admitted: Caller | None, receive: Receive, declared: bytes | None
               ) -> Answer | None:
    """The answer of ``POST path`` (a key of :data:`HOT_ROUTES`), as :func:`respond`
    gives it, in one coroutine (no second one wrapping it): ``authorization`` is the
    request's ``Authorization`` header value (``b""``: none; ``None``: several, refused
    401 before the body is read), ``admitted`` the caller the rate-limit door admitted
    (and counted) for that very header, ``declared`` its ``Content-Length``."""
    try:
        handler, decision = HOT_ROUTES[path]
        if admitted is not None:
            # The door admitted it for this one header, a bearer key it found
            # (ratelimit.door_count): admitted_caller's checks hold, its tenant is set.
            logs.tenant.set(admitted.tenant)
            caller = admitted
        else:
            header = None if authorization is None else authorization.decode("latin-1")
            caller = await authenticate_header(ctx, header, None, decision=decision)
        limit = ctx.settings.max_body_bytes
        content = orjson.dumps(await handler(
            ctx, caller, lambda: receive_body(receive, declared, limit)))
    except Exception as exc:  # noqa: BLE001 - answered as respond() answers it
        return _failed(exc)
    return 200, [(b"content-length", str(len(content)).encode()), _JSON], content


async def read_approval(ctx: AppContext, authorization: bytes | None,
                        admitted: Caller | None, approval_id: str, wait_s: float) -> bytes:
    """The JSON answer of the long-poll read (``authorization`` as for :func:`post`),
    serialised through the route's response model by
    FastAPI's own ``serialize_response``, as the route would."""
    route = route_for(APPROVAL_TEMPLATE)
    caller = await authenticate_header(
        ctx, None if authorization is None else authorization.decode("latin-1"), admitted,
        decision=False)
    state = await approval_queries.get_state(ctx, caller, approval_id, wait_s=wait_s)
    return bytes(await serialize_response(
        field=route.response_field, response_content=state,
        include=route.response_model_include, exclude=route.response_model_exclude,
        by_alias=route.response_model_by_alias,
        exclude_unset=route.response_model_exclude_unset,
        exclude_defaults=route.response_model_exclude_defaults,
        exclude_none=route.response_model_exclude_none, dump_json=True))



async def respond(work: Awaitable[bytes]) -> Answer | None:
    """``(status, headers, body)`` of ``await work``: 200 JSON (``content-length`` then
    ``content-type``, as ``json_response`` sends); a :class:`CosignerError` as its RFC
    9457 problem; anything else logged and answered as the FastAPI app's 500
    ``internal_error``. ``None`` when the client left before its body arrived (nobody to
    answer). The headers list is new: the caller may append to it."""
    try:
        content = await work
    except Exception as exc:  # noqa: BLE001 - _failed sorts it
        return _failed(exc)
    return 200, [(b"content-length", str(len(content)).encode()), _JSON], content


def _failed(exc: Exception) -> Answer | None:
    """The answer of a hot route that raised ``exc`` (see :func:`respond`)."""
    if isinstance(exc, CosignerError):
        response = problems.to_response(exc)
    elif isinstance(exc, ClientDisconnect):
        return None
    else:  # as the FastAPI app's catch-all handler
        log.exception("unhandled error", exc_info=exc)
        response = problems.problem(500, "internal_error", "Internal error",
                                    "internal error; see server log")
    return response.status_code, response.raw_headers, bytes(response.body)
