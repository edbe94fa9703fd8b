"""Same-origin check on every state-changing ``/ui`` request (defence in depth beside CSRF).

A ``POST`` (or any method but ``GET``/``HEAD``/``OPTIONS``) under ``/ui`` is refused with
403 ``cross_origin`` unless:

* its ``Origin`` header is the server's own origin: the scheme, host and port of the request
  itself (``X-Forwarded-Proto``/``-Host`` count only from trusted proxies, applied before
  this check by :mod:`cosigner.http.proxies`; default ports 80/443 may be omitted); or
* it has no ``Origin`` and its ``Sec-Fetch-Site`` is ``same-origin``.

A request with neither header is refused too: ``/ui`` is for browsers, and every current
browser sends ``Origin`` on a form ``POST``. ``Origin: null`` (sandboxed frames, some
redirects) is refused. Each refusal is a warning log line and, when the request carries a
live session, an ``web.request_refused`` event in that session's tenant chain (without a
session there is no tenant to record it in, and an anonymous sender must not be able to
write to the system chain).
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from cosigner.audit.chain import Event, append
from cosigner.context import AppContext
from cosigner.core.errors import Forbidden
from cosigner.web import sessions

log = logging.getLogger("cosigner.web")

PREFIX = "/ui"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_PORTS = {"http": 80, "https": 443}
Origin = tuple[str, str, int]


def parse_origin(text: str) -> Origin | None:
    """``(scheme, host, port)`` of an ``Origin`` header value, or ``None`` if malformed."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.path or parts.query \
            or parts.fragment or parts.username is not None:
        return None
    return scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme]


def own_origin(request: Request) -> Origin | None:
    """The origin the request was sent to (scheme, ``Host``, port)."""
    return parse_origin(f"{request.url.scheme}://{request.url.netloc}")


def refusal(request: Request) -> str | None:
    """Why this state-changing request is not same-origin, or ``None`` when it is."""
    origin = request.headers.get("origin")
    if origin is not None:
        claimed = parse_origin(origin)
        if claimed is None or claimed != own_origin(request):
            return f"Origin {origin[:200]!r} is not this server's"
        return None
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return None if site == "same-origin" else f"Sec-Fetch-Site {site[:50]!r}"
    return "no Origin or Sec-Fetch-Site header"


class SameOrigin:
    """Pure ASGI middleware refusing cross-origin state changes under :data:`PREFIX`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope.get("method", "GET") in SAFE_METHODS or not (
                path == PREFIX or path.startswith(PREFIX + "/")):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        reason = refusal(request)
        if reason is None:
            await self.app(scope, receive, send)
            return
        response = await refuse(request, reason)
        await response(scope, receive, send)


async def refuse(request: Request, reason: str) -> Response:
    """Log the refusal (and record it for a signed-in caller); the 403 page to send."""
    from cosigner.web.render import page

    error = Forbidden("cross-origin form post refused", code="cross_origin")
    client = request.client.host if request.client else "unknown"
    log.warning("refused %s %s from %s: %s (%s)", request.method, request.url.path, client,
                error.code, reason)
    await _record(request, error.code, reason)
    return page(request, "error.html", status=403, user=None, code=error.code,
                message="This form was sent from another site. Nothing was changed.")


async def _record(request: Request, code: str, reason: str) -> None:
    deps: AppContext | None = getattr(request.app.state, "context", None)
    raw = request.cookies.get(sessions.COOKIE)
    if deps is None or not raw:
        return
    try:
        caller = await sessions.load(deps.db, raw, now=deps.clock(),
                                     idle_timeout_s=deps.settings.session_idle_timeout_s,
                                     max_age_s=deps.settings.session_max_age_s)
        if caller is None:
            return
        event = Event(type="web.request_refused", actor=caller.actor(),
                      payload={"code": code, "method": request.method,
                               "path": request.url.path[:200], "reason": reason})
        async with deps.db.transaction() as conn:
            await append(conn, caller.tenant, [event], now=deps.clock())
    except Exception:  # noqa: BLE001 - the refusal itself stands; the log line has it
        log.exception("could not record refused %s %s", request.method, request.url.path)
