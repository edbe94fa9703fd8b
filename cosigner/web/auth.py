"""Who is signed in: the session cookie is the only source of a web caller's identity."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import Response

from cosigner.http.deps import context
from cosigner.identity.principals import Caller
from cosigner.web import csrf, sessions


class SignInRequired(Exception):
    """No live session: GET pages redirect to the sign-in form, POSTs get 403."""


#: The longest ``next`` kept (a pending single sign-on stores it in a 512-character column).
MAX_NEXT_CHARS = 512


def safe_next(target: str | None) -> str:
    """Only local ``/ui`` paths (no open redirect) of at most :data:`MAX_NEXT_CHARS`."""
    if target and len(target) <= MAX_NEXT_CHARS and target.startswith("/ui") \
            and "//" not in target and "\\" not in target:
        return target
    return "/ui"


def cookie_secure(request: Request) -> bool:
    """``Secure`` cookies when this request, or the public URL, is https."""
    public_url: str = context(request).settings.public_url
    return request.url.scheme == "https" or public_url.startswith("https://")


async def current_user(request: Request) -> Caller | None:
    """The caller of the request's session cookie, or ``None`` (also for a password
    session of a tenant whose passwords are now switched off: it is ended)."""
    raw = request.cookies.get(sessions.COOKIE)
    if not raw:
        return None
    deps = context(request)
    caller = await sessions.load(deps.db, raw, now=deps.clock(),
                                 idle_timeout_s=deps.settings.session_idle_timeout_s,
                                 max_age_s=deps.settings.session_max_age_s)
    provider = deps.settings.oidc.get(caller.tenant) if caller is not None else None
    if caller is not None and caller.authn.method == "password" and provider is not None \
            and not provider.allow_passwords:
        # Passwords were switched off for the tenant after this session began: a session
        # in use never idles out, so it would keep the switched-off password alive.
        await sessions.end(deps.db, raw)
        return None
    if caller is not None:
        request.state.web_user = caller
        request.state.web_csrf = csrf.token_for(raw)
    return caller


async def require_user(request: Request) -> Caller:
    """The signed-in caller; raises :class:`SignInRequired` otherwise."""
    caller = await current_user(request)
    if caller is None:
        raise SignInRequired()
    return caller


UserDep = Annotated[Caller, Depends(require_user)]


def check_csrf(request: Request, submitted: str | None) -> bool:
    """True when the form's token belongs to this request's session cookie."""
    return csrf.is_valid(request.cookies.get(sessions.COOKIE), submitted)


def csrf_refused(request: Request) -> Response:
    """The 403 page for a form whose token is not this session's (nothing was changed)."""
    from cosigner.web.render import page

    return page(request, "error.html", status=403,
                message="This form is not valid for your session. Nothing was changed.")
