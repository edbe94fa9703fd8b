"""Single sign-on pages: start a sign-in at the tenant's OpenID provider, finish it.

``GET /ui/oidc/start?tenant=&next=`` (plus ``step_up=1&acr_values=&max_age=`` when a
review asked for a stronger sign-in) stores a pending sign-in
(:mod:`cosigner.identity.oidc_signin`; 429 ``oidc_too_many_pending`` with ``Retry-After``
when the client address already has ``settings.oidc_pending_per_address_max`` unfinished
ones), sets the browser-binding cookie
:data:`BROWSER_COOKIE` and redirects to the provider. ``GET /ui/oidc/callback`` consumes
the ``state``, checks the provider's answer (RFC 9207 ``iss`` when the provider sends it),
exchanges the code, checks the ID token (:mod:`cosigner.identity.oidc`), signs the person
in with a new session recording ``authn``, and sends them on to ``next``.

The browser-binding cookie is ``SameSite=Lax`` (it must come back on the provider's
top-level redirect); the session cookie stays ``Strict``, so the callback answers with a
small same-origin page that moves on to ``next`` (a redirect still counted as coming
from the provider would not carry it). Links, not forms, lead to the provider: the pages'
CSP ``form-action 'self'`` also covers where a form's redirects go.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from cosigner.approvals.stepup import StepUp
from cosigner.core.errors import CosignerError, SignInRefused
from cosigner.core.settings import OidcProvider
from cosigner.http.deps import context
from cosigner.identity import oidc_signin
from cosigner.identity.principals import Caller
from cosigner.web import sessions
from cosigner.web.auth import cookie_secure, safe_next
from cosigner.web.render import page

log = logging.getLogger("cosigner.web")
router = APIRouter(prefix="/ui/oidc", include_in_schema=False)

BROWSER_COOKIE = "cosigner_oidc"
CALLBACK_PATH = "/ui/oidc/callback"
_ACR_RE = re.compile(r"^[\x21-\x7e]{1,256}( [\x21-\x7e]{1,256}){0,9}\Z")

#: What the person is told, by refusal code; "Nothing was signed in" follows each.
MESSAGES = {
    "oidc_not_configured": "Single sign-on is not set up for this tenant.",
    "oidc_bad_request": "This sign-in link is malformed.",
    "oidc_unavailable": "The identity provider cannot be reached right now.",
    "oidc_state_invalid": "This sign-in link was already used, or it was started in "
                          "another browser.",
    "oidc_state_expired": "This sign-in took too long.",
    "oidc_too_many_pending": "Too many sign-ins were started from your network and not "
                             "finished. Finish one, or try again in a few minutes.",
    "oidc_idp_error": "The identity provider did not sign you in.",
    "oidc_wrong_issuer": "The answer came from another identity provider than this "
                         "tenant's.",
    "oidc_token_exchange_failed": "The identity provider refused to complete the sign-in.",
    "oidc_bad_signature": "The identity provider's sign-in token has an invalid signature.",
    "oidc_wrong_audience": "The sign-in token was issued for another application.",
    "oidc_expired": "The sign-in token has expired.",
    "oidc_nonce_mismatch": "The sign-in token belongs to another sign-in (a replay).",
    "oidc_bad_token": "The sign-in token is not acceptable.",
    "oidc_no_role": "You signed in, but none of your groups gives you an approver role "
                    "in Cosigner. Ask your administrator to add you to an approver group.",
    "oidc_subject_conflict": "Another Cosigner account already has this identity.",
    "oidc_principal_disabled": "Your Cosigner account is disabled.",
}


def redirect_uri(request: Request) -> str:
    """The callback URL registered at the provider: ``{public_url}/ui/oidc/callback``."""
    return context(request).settings.public_url.rstrip("/") + CALLBACK_PATH


def start_link(tenant: str, next_path: str, *, acr_values: str | None = None,
               max_age: int | None = None, step_up: bool = False) -> str:
    """The local link that starts a (step-up) sign-in."""
    query: dict[str, str] = {"tenant": tenant, "next": next_path}
    if step_up:
        query["step_up"] = "1"
    if acr_values:
        query["acr_values"] = acr_values
    if max_age is not None:
        query["max_age"] = str(max_age)
    return "/ui/oidc/start?" + urlencode(query)


def refused(request: Request, error: CosignerError, *, status: int) -> Response:
    """The error page of a refused sign-in (the person is not signed in)."""
    text = MESSAGES.get(error.code, "The sign-in was refused.") + " Nothing was signed in."
    return page(request, "error.html", status=status, user=None, code=error.code,
                message=text)


@router.get("/start")
async def start(request: Request, tenant: str = "", next: str = "/ui", step_up: str = "",
                acr_values: str = "", max_age: int | None = None) -> Response:
    """Redirect to the tenant's provider (authorization code + PKCE, ``nonce``; a step-up
    also sends ``acr_values``, ``max_age`` and ``prompt=login``)."""
    deps = context(request)
    tenant = tenant.strip()[:128]
    provider = deps.settings.oidc.get(tenant)
    if provider is None:
        return refused(request, SignInRefused(code="oidc_not_configured"), status=404)
    if acr_values and not _ACR_RE.match(acr_values) or (
            max_age is not None and not 0 <= max_age <= 2_592_000):
        return refused(request, SignInRefused(code="oidc_bad_request"), status=422)
    try:
        meta = await deps.oidc.metadata(provider)
    except SignInRefused as exc:
        log.warning("single sign-on for tenant %s: %s", tenant, exc.detail)
        return refused(request, exc, status=502)
    browser = request.cookies.get(BROWSER_COOKIE) or sessions.new_id()
    wanted = {"acr_values": acr_values or None, "max_age": max_age} if step_up else None
    # The real peer, or behind a trusted proxy the address it saw (cosigner.http.proxies).
    address = request.client.host if request.client else "unknown"
    try:
        state, pending = await oidc_signin.begin(
            deps.db, tenant=tenant, browser_secret=browser, next_path=safe_next(next),
            step_up=wanted, now=deps.clock(), ttl_s=deps.settings.oidc_login_ttl_s,
            address=address, max_pending=deps.settings.oidc_pending_per_address_max)
    except SignInRefused as exc:
        log.warning("refused single sign-on start for tenant %s from %s (%s)", tenant,
                    address, exc.code)
        busy = refused(request, exc, status=429)
        busy.headers["Retry-After"] = str(exc.extra.get("retry_after_s", 60))
        return busy
    url = deps.oidc.authorization_url(
        provider, meta, redirect_uri=redirect_uri(request), state=state, nonce=pending.nonce,
        code_verifier=pending.code_verifier, acr_values=acr_values or None,
        max_age=max_age if step_up else None, prompt="login" if step_up else None)
    response = RedirectResponse(url, status_code=303)
    response.set_cookie(BROWSER_COOKIE, browser, max_age=deps.settings.oidc_login_ttl_s,
                        httponly=True, samesite="lax", path="/ui/oidc",
                        secure=cookie_secure(request))
    return response


@router.get("/callback")
async def callback(request: Request, state: str = "", code: str = "", error: str = "",
                   iss: str | None = None) -> Response:
    """Finish a sign-in: every check in the module docstring, then a new session."""
    deps = context(request)
    now = deps.clock()
    try:
        pending = await oidc_signin.consume(
            deps.db, state=state, browser_secret=request.cookies.get(BROWSER_COOKIE), now=now)
    except SignInRefused as exc:
        log.warning("refused single sign-on callback (%s): %s", exc.code, exc.detail)
        return refused(request, exc, status=400)
    provider = deps.settings.oidc.get(pending.tenant)
    if provider is None:
        return refused(request, SignInRefused(code="oidc_not_configured"), status=404)
    try:
        caller = await _finish(request, provider, pending, code=code, error=error, iss=iss)
    except SignInRefused as exc:
        log.warning("refused single sign-on for tenant %s (%s): %s", pending.tenant,
                    exc.code, exc.detail)
        status = 403 if exc.code in ("oidc_no_role", "oidc_principal_disabled",
                                     "oidc_subject_conflict") else (
            502 if exc.code == "oidc_unavailable" else 401)
        return refused(request, exc, status=status)
    old = request.cookies.get(sessions.COOKIE)
    if old:
        await sessions.end(deps.db, old)
    raw = await sessions.create(deps.db, caller, now=now,
                                idle_timeout_s=deps.settings.session_idle_timeout_s)
    response = page(request, "continue.html", user=None, next=pending.next_path)
    response.set_cookie(sessions.COOKIE, raw, httponly=True, samesite="strict", path="/ui",
                        secure=cookie_secure(request))
    response.delete_cookie(sessions.PRE_COOKIE, path="/ui")
    return response


async def _finish(request: Request, provider: OidcProvider, pending: oidc_signin.Pending, *,
                  code: str, error: str, iss: str | None) -> Caller:
    deps = context(request)
    tenant = pending.tenant
    # Refusals before the provider handed over a token are log lines only (anyone can
    # call this URL); refusals of a token it issued go to the tenant's chain as well.
    if error or not code:
        log.warning("single sign-on for tenant %s: the provider answered %r", tenant,
                    error[:100] or "no code")
        raise SignInRefused(code="oidc_idp_error")
    meta = await deps.oidc.metadata(provider)
    if (iss is not None or meta.iss_parameter) and iss != provider.issuer:
        log.warning("single sign-on for tenant %s: iss %r is not the issuer", tenant,
                    (iss or "")[:200])
        raise SignInRefused(code="oidc_wrong_issuer")
    id_token = await deps.oidc.exchange(provider, meta, code=code[:2048],
                                        redirect_uri=redirect_uri(request),
                                        code_verifier=pending.code_verifier)
    try:
        token = await deps.oidc.validate(provider, meta, id_token, nonce=pending.nonce,
                                         now=deps.clock().timestamp())
    except SignInRefused as exc:
        await oidc_signin.record_refusal(deps.db, tenant=tenant, provider=provider,
                                         error=exc, now=deps.clock())
        raise
    return await oidc_signin.sign_in(deps.db, tenant=tenant, provider=provider, token=token,
                                     clock=deps.clock, step_up=pending.step_up)


def step_up_page(request: Request, user: Caller, approval_id: str,
                 exc: CosignerError) -> Response:
    """A review refused with ``step_up_required``: why, and the link that signs the
    approver in again at the provider (``prompt=login``, with the stage's ``acr_values``
    and ``max_age``) and brings them back to this request."""
    deps = context(request)
    provider = deps.settings.oidc.get(user.tenant)
    wanted = exc.extra.get("step_up") or {}
    link = None
    if provider is not None:
        asked = StepUp(wanted.get("assurance"), wanted.get("min_acr"),
                       wanted.get("max_auth_age_s"))
        link = start_link(user.tenant, f"/ui/approvals/{approval_id}",
                          acr_values=asked.acr_values(provider),
                          max_age=asked.max_auth_age_s, step_up=True)
    return page(request, "step_up.html", status=403, message=exc.detail, link=link,
                label=provider.label if provider else "", approval_id=approval_id,
                code=exc.code)
