"""The approver web form: server-rendered pages under ``/ui`` (no JavaScript needed, but
for passkeys: registering one and signing a review use ``static/passkeys.js``)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"


def install(app: FastAPI) -> None:
    """Add the ``/ui`` routes, static files and security headers to ``app``."""
    from cosigner.web import routes, routes_auth, routes_oidc, routes_passkeys, routes_slack
    from cosigner.web.auth import SignInRequired
    from cosigner.web.headers import SecurityHeaders
    from cosigner.web.origin import SameOrigin

    app.include_router(routes_auth.router)
    app.include_router(routes_oidc.router)
    app.include_router(routes.router)
    app.include_router(routes_slack.router)
    app.include_router(routes_passkeys.router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
    app.add_middleware(SameOrigin)  # inside SecurityHeaders: its 403 gets the headers too
    app.add_middleware(SecurityHeaders)
    app.add_exception_handler(SignInRequired, _sign_in_required)


async def _sign_in_required(request: Request, _: Exception) -> Response:
    """GET: redirect to the sign-in form; anything else: 403, nothing changed."""
    if request.method in ("GET", "HEAD"):
        target = quote(request.url.path, safe="/")
        return RedirectResponse(f"/ui/login?next={target}", status_code=303)
    from cosigner.web.render import page

    return page(request, "error.html", status=403, user=None,
                message="You are not signed in (or your session ended). Nothing was changed.")
