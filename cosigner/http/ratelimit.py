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
there) and counts it.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from cosigner.core.errors import RateLimited
from cosigner.http.problems import PROBLEM_TYPE

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
        key = _bearer(scope)
        ctx = getattr(scope["app"].state, "context", None) if "app" in scope else None
        if key is None or ctx is None:
            await self.app(scope, receive, send)
            return
        caller = ctx.authenticator.cached(key)
        if caller is None:
            await self.app(scope, receive, send)  # the route authenticates and counts
            return
        try:
            await ctx.quotas.admit(caller)
            if scope["method"] == "POST" and scope["path"] == "/v1/decisions":
                await ctx.quotas.count_decision(caller)
        except RateLimited as exc:
            await _refuse(send, exc)
            return
        scope.setdefault("state", {})[CALLER_STATE] = caller
        await self.app(scope, receive, send)


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            return key.strip() if scheme.lower() == "bearer" and key.strip() else None
    return None


async def _refuse(send: Send, exc: RateLimited) -> None:
    retry = exc.extra.get("retry_after")
    body: dict[str, Any] = {"type": PROBLEM_TYPE + exc.code, "title": exc.title,
                            "status": 429, "detail": exc.detail, "code": exc.code,
                            **exc.extra}
    content = orjson.dumps(body)
    await send({"type": "http.response.start", "status": 429, "headers": [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(content)).encode()),
        (b"retry-after", str(max(1, int(retry)) if isinstance(retry, int) else 1).encode()),
    ]})
    await send({"type": "http.response.body", "body": content})
