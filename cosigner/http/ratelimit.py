"""Rate limits at the door: a pure ASGI middleware in front of the framework.

A refused request must cost far less than a decision, or a tenant flooding at several
times capacity still takes the CPU every other tenant needs (case K30). So for
``/v1/*`` this middleware authenticates the bearer key from the key cache only (never
the database) and counts the request against its credential's and tenant's limits —
and ``POST /v1/decisions`` against the tenant's decision quota — before routing,
validation or dependencies run (:mod:`cosigner.identity.quotas`). Past a limit it
answers the 429 problem itself (``rate_limited``, ``Retry-After``). An admitted caller
is left in the request state, so :func:`cosigner.http.deps.authenticate` does not count
it twice; a key the cache does not hold goes to the route, which authenticates it (401
there) and counts it. A 429 here carries the request id like any answer
(``X-Request-ID``: the caller's when plain, else a new one) and is logged under it (the
access line, when on: :func:`cosigner.http.telemetry.log_refusal`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from cosigner.context import AppContext
from cosigner.core.errors import RateLimited
from cosigner.http.problems import PROBLEM_TYPE
from cosigner.http.telemetry import first_header, log_refusal, request_id
from cosigner.identity.principals import Caller
from cosigner.identity.quotas import Refused

#: Key of the admitted :class:`Caller` in the ASGI scope's ``state``.
CALLER_STATE = "cosigner_caller"


class RateLimit:
    """Pure ASGI middleware; see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        ctx = getattr(scope["app"].state, "context", None) if "app" in scope else None
        started = time.perf_counter()
        caller, refused = door_count(ctx, only_authorization(scope.get("headers", ())),
                                     decision=scope["method"] == "POST"
                                     and scope["path"] == "/v1/decisions")
        if refused is not None:  # recorded, then the 429
            assert ctx is not None and caller is not None
            try:
                await ctx.quotas.refuse(caller, refused)
            except RateLimited as exc:
                rid = request_id(first_header(scope, b"x-request-id"))
                await refuse(send, exc, rid)
                if ctx.settings.access_log:  # logged like any answer
                    log_refusal(scope, 429, started, rid, caller.tenant)
                return
        if caller is not None:
            scope.setdefault("state", {})[CALLER_STATE] = caller
        await self.app(scope, receive, send)


def door_count(ctx: AppContext | None, authorization: bytes | None, *,
               decision: bool) -> tuple[Caller | None, Refused | None]:
    """The caller admitted at the door for a ``/v1/*`` request whose ``Authorization``
    header is ``authorization`` (as :func:`only_authorization` gives it: ``b""`` without
    one, ``None`` with several), and its refusal: its bearer key found in the key cache
    and counted (:meth:`Quotas.count`; with ``decision``, against the decision quota too).
    ``(caller, None)`` when admitted, ``(None, None)`` (nothing counted) without a
    context, a bearer key or a cached key, or with several headers (the route
    authenticates and counts, or refuses: 401); ``(caller, refused)`` past a limit — the
    door then awaits ``ctx.quotas.refuse(caller, refused)``, which records the refusal
    and raises :class:`RateLimited` (answered by :func:`refuse`)."""
    if authorization is None or ctx is None:
        return None, None
    scheme, _, key = authorization.decode("latin-1").partition(" ")
    key = key.strip()
    if not key or scheme.lower() != "bearer":
        return None, None
    caller = ctx.authenticator.cached(key)
    if caller is None:
        return None, None
    return caller, ctx.quotas.count(caller, decision=decision)


def only_authorization(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The value of a request's ``Authorization`` header among its raw ASGI ``headers``:
    ``b""`` without one, ``None`` with more than one — refused on every path (401
    ``unauthenticated``, :func:`cosigner.http.deps.authenticate_header`), since which of
    them names the caller would be a guess."""
    found: bytes | None = b""
    seen = False
    for name, value in headers:
        if name == b"authorization":
            if seen:
                return None
            found, seen = bytes(value), True
    return found


async def refuse(send: Send, exc: RateLimited, rid: str) -> None:
    """Answer the door's 429 ``rate_limited`` problem (``Retry-After``), with request id
    ``rid`` (:func:`cosigner.http.telemetry.request_id`) echoed last in the headers, as
    :class:`cosigner.http.telemetry.RequestTelemetry` echoes it on every other answer."""
    retry = exc.extra.get("retry_after")
    body: dict[str, Any] = {"type": PROBLEM_TYPE + exc.code, "title": exc.title,
                            "status": 429, "detail": exc.detail, "code": exc.code,
                            **exc.extra}
    content = orjson.dumps(body)
    await send({"type": "http.response.start", "status": 429, "headers": [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(content)).encode()),
        (b"retry-after", str(max(1, int(retry)) if isinstance(retry, int) else 1).encode()),
        (b"x-request-id", rid.encode()),
    ]})
    await send({"type": "http.response.body", "body": content})
