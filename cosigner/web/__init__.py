"""The approver web form: server-rendered pages under ``/ui`` (no JavaScript needed, but
for passkeys: registering one and signing a review use ``static/passkeys.js``).

The page routes (and what they import: accounts and argon2, babel, the views) are added
to the app by the first request under ``/ui`` (:class:`PagesOnFirstUse`), not at startup:
~1.9 MB of a server that never serves a page (issue 20, idle memory). The static files,
the security-header and same-origin middlewares and the sign-in handler are installed at
once (middlewares cannot be added once the app serves).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette._utils import get_route_path
from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import Receive, Scope, Send

STATIC = Path(__file__).parent / "static"
PREFIX = "/ui"


def install(app: FastAPI) -> None:
    """Add the ``/ui`` routes (on first use), static files and security headers to ``app``."""
    from cosigner.web.auth import SignInRequired
    from cosigner.web.headers import SecurityHeaders
    from cosigner.web.origin import SameOrigin

    app.router.routes.append(PagesOnFirstUse(app))
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
    app.add_middleware(SameOrigin)  # inside SecurityHeaders: its 403 gets the headers too
    app.add_middleware(SecurityHeaders)
    app.add_exception_handler(SignInRequired, _sign_in_required)


def include_pages(app: FastAPI) -> list[BaseRoute]:
    """Import the page routers and put their routes where :class:`PagesOnFirstUse`
    stands in ``app``'s routes (once: later calls return ``[]``)."""
    routes = app.router.routes
    lazy = [i for i, route in enumerate(routes) if isinstance(route, PagesOnFirstUse)]
    if not lazy:
        return []
    from cosigner.web import routes as pages
    from cosigner.web import routes_auth, routes_oidc, routes_passkeys, routes_slack

    before = len(routes)
    for router in (routes_auth.router, routes_oidc.router, pages.router,
                   routes_slack.router, routes_passkeys.router):
        app.include_router(router)
    added = routes[before:]
    del routes[before:]
    routes[lazy[0]:lazy[0] + 1] = added
    return added


class PagesOnFirstUse(BaseRoute):
    """Stands for the page routes in the app's route list until a request under ``/ui``
    (or a ``url_path_for`` of a page) comes: it then includes them in its place
    (:func:`include_pages`) and hands the request to the app's router again, which now
    finds the page's own route. Synchronous between two awaits, so two first requests
    cannot include them twice."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http":
            return Match.NONE, {}
        path = get_route_path(scope)  # as the routes match it (without root_path)
        if path == PREFIX or path.startswith(PREFIX + "/"):
            return Match.FULL, {}
        return Match.NONE, {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        include_pages(self._app)
        await self._app.router(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        for route in include_pages(self._app):
            try:
                return route.url_path_for(name, **path_params)
            except NoMatchFound:
                continue
        raise NoMatchFound(name, path_params)


async def _sign_in_required(request: Request, _: Exception) -> Response:
    """GET: redirect to the sign-in form; anything else: 403, nothing changed."""
    if request.method in ("GET", "HEAD"):
        target = quote(request.url.path, safe="/")
        return RedirectResponse(f"/ui/login?next={target}", status_code=303)
    from cosigner.web.render import page

    return page(request, "error.html", status=403, user=None,
                message="You are not signed in (or your session ended). Nothing was changed.")
