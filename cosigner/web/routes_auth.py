"""Sign-in and sign-out pages.

The sign-in page offers what the tenant allows: a link to its single sign-on
(:mod:`cosigner.web.routes_oidc`) when ``settings.oidc`` names the tenant, and the password
form unless that tenant's ``allow_passwords`` is false (then a password post for it is
refused, 403, before any password is checked).
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from cosigner.core.errors import Unauthenticated
from cosigner.core.settings import Settings
from cosigner.http.deps import context
from cosigner.identity import accounts
from cosigner.web import csrf, sessions
from cosigner.web.auth import check_csrf, cookie_secure, current_user
from cosigner.web.auth import safe_next as _safe_next
from cosigner.web.render import page
from cosigner.web.routes_oidc import start_link

log = logging.getLogger("cosigner.web")
router = APIRouter(prefix="/ui", include_in_schema=False)


def _limits(settings: Settings) -> accounts.SigninLimits:
    return accounts.SigninLimits(
        account=settings.signin_account_limit, address=settings.signin_address_limit,
        window_s=settings.signin_window_s, lockout_s=settings.signin_lockout_s,
        backoff_s=settings.signin_backoff_s)


def _set_cookie(response: Response, request: Request, name: str, value: str) -> None:
    response.set_cookie(name, value, httponly=True, samesite="strict", path="/ui",
                        secure=cookie_secure(request))


def _login_form(request: Request, *, tenant: str, name: str, next_: str,
                message: str | None = None, status: int = 200) -> Response:
    pre = request.cookies.get(sessions.PRE_COOKIE) or sessions.new_id()
    configured = context(request).settings.oidc
    provider = configured.get(tenant.strip())
    sso_link = sso_label = None
    if provider is not None:
        sso_link, sso_label = start_link(tenant.strip(), next_), provider.label
    response = page(request, "login.html", status=status, tenant=tenant, name=name,
                    next=next_, csrf=csrf.token_for(pre), message=message, user=None,
                    sso_link=sso_link, sso_label=sso_label, sso_any=bool(configured),
                    passwords=provider is None or provider.allow_passwords)
    if request.cookies.get(sessions.PRE_COOKIE) != pre:
        _set_cookie(response, request, sessions.PRE_COOKIE, pre)
    return response


@router.get("/login")
async def login_form(request: Request, tenant: str = "", next: str = "/ui") -> Response:
    """The sign-in form (tenant, name, password)."""
    if await current_user(request) is not None:
        return RedirectResponse(_safe_next(next), status_code=303)
    return _login_form(request, tenant=tenant[:128], name="", next_=_safe_next(next))


@router.post("/login")
async def login(request: Request, tenant: Annotated[str, Form(max_length=128)] = "",
                name: Annotated[str, Form(max_length=256)] = "",
                password: Annotated[str, Form(max_length=1024)] = "",
                csrf_token: Annotated[str, Form(max_length=128)] = "",
                next: Annotated[str, Form(max_length=512)] = "/ui") -> Response:
    """Check the password and start a fresh session (a new id every sign-in)."""
    next_ = _safe_next(next)
    if not csrf.is_valid(request.cookies.get(sessions.PRE_COOKIE), csrf_token):
        return _login_form(request, tenant=tenant, name=name, next_=next_, status=403,
                           message="The form expired. Please sign in again.")
    deps = context(request)
    # The real peer, or behind a trusted proxy the address it saw (cosigner.http.proxies).
    address = request.client.host if request.client else "unknown"
    provider = deps.settings.oidc.get(tenant.strip())
    if provider is not None and not provider.allow_passwords:
        log.warning("refused password sign-in for tenant %s from %s: single sign-on only",
                    tenant.strip(), address)
        return _login_form(request, tenant=tenant.strip(), name=name, next_=next_,
                           status=403, message="This tenant signs in with single sign-on "
                           "only; passwords are switched off.")
    try:
        caller = await accounts.authenticate_password(
            deps.db, tenant=tenant.strip(), name=name.strip(), password=password,
            address=address, clock=deps.clock, limits=_limits(deps.settings))
    except Unauthenticated as exc:
        text = ("Too many failed sign-ins. Try again in a few minutes."
                if exc.code == "signin_throttled" else "Wrong name or password.")
        return _login_form(request, tenant=tenant, name=name, next_=next_,
                           status=429 if exc.code == "signin_throttled" else 401,
                           message=text)
    old = request.cookies.get(sessions.COOKIE)
    if old:
        await sessions.end(deps.db, old)
    raw = await sessions.create(deps.db, caller, now=deps.clock(),
                                idle_timeout_s=deps.settings.session_idle_timeout_s)
    response = RedirectResponse(next_, status_code=303)
    _set_cookie(response, request, sessions.COOKIE, raw)
    response.delete_cookie(sessions.PRE_COOKIE, path="/ui")
    return response


@router.post("/logout")
async def logout(request: Request,
                 csrf_token: Annotated[str, Form(max_length=128)] = "") -> Response:
    """End the session (CSRF-checked so another site cannot sign you out)."""
    if not check_csrf(request, csrf_token):
        return page(request, "error.html", status=403, user=None,
                    message="This form is not valid for your session.")
    raw = request.cookies.get(sessions.COOKIE)
    if raw:
        await sessions.end(context(request).db, raw)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(sessions.COOKIE, path="/ui")
    return response
