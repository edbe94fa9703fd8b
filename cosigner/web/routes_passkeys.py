"""Approver pages for passkeys (WebAuthn): register, list, remove, and sign a review.

The browser side is ``/ui/static/passkeys.js`` (same origin, allowed by the CSP; no inline
script). Its JSON calls carry the session's CSRF token in ``X-CSRF-Token`` and are refused
(403) without it; the same-origin check (:mod:`cosigner.web.origin`) applies as to every
``/ui`` post. Every rule lives in :mod:`cosigner.identity.passkeys` and
:mod:`cosigner.approvals.signatures`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from cosigner.approvals import signatures
from cosigner.core.errors import CosignerError
from cosigner.http.deps import context
from cosigner.identity import passkeys
from cosigner.web import pages
from cosigner.web.auth import UserDep, check_csrf, csrf_refused
from cosigner.web.render import page

router = APIRouter(prefix="/ui", include_in_schema=False)

HEADER = "x-csrf-token"
MAX_JSON_BYTES = 64 * 1024


def _problem(status: int, code: str, detail: str) -> JSONResponse:
    return JSONResponse({"code": code, "detail": detail}, status_code=status)


async def _json(request: Request) -> Any:
    """The request's JSON object, or ``None`` when missing, too large or not an object."""
    body = await request.body()
    if len(body) > MAX_JSON_BYTES:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _refusal(exc: CosignerError) -> JSONResponse:
    text = signatures.REFUSALS.get(exc.code) or pages.refusal_text(exc)
    return _problem(pages.status_for(exc), exc.code, text)


@router.get("/passkeys")
async def passkeys_page(request: Request, user: UserDep, done: str | None = None) -> Response:
    """The signed-in person's passkeys, with the button to add one."""
    items = await passkeys.list_credentials(context(request).db, user)
    message = {"removed": "The passkey was removed."}.get(done or "")
    return page(request, "passkeys.html", items=items, message=message,
                message_kind="ok" if message else "error")


@router.post("/passkeys/options")
async def registration_options(request: Request, user: UserDep) -> Response:
    """``navigator.credentials.create()`` options (a challenge stored for two minutes)."""
    if not check_csrf(request, request.headers.get(HEADER)):
        return _problem(403, "forbidden", "This request is not valid for your session.")
    deps = context(request)
    try:
        options = await passkeys.begin_registration(
            deps.db, deps.clock, user, passkeys.relying_party(deps.settings.public_url))
    except CosignerError as exc:
        return _refusal(exc)
    return JSONResponse(options)


@router.post("/passkeys")
async def register(request: Request, user: UserDep) -> Response:
    """Finish a registration: ``{"credential": <create() response JSON>, "name": str}``."""
    if not check_csrf(request, request.headers.get(HEADER)):
        return _problem(403, "forbidden", "This request is not valid for your session.")
    data = await _json(request)
    if data is None or not isinstance(data.get("credential"), dict):
        return _problem(422, "invalid_request", "expected {credential, name}")
    deps = context(request)
    name = data.get("name") if isinstance(data.get("name"), str) else ""
    try:
        view = await passkeys.finish_registration(
            deps.db, deps.clock, user, passkeys.relying_party(deps.settings.public_url),
            data["credential"], name=name)
    except CosignerError as exc:
        return _problem(pages.status_for(exc), exc.code, exc.detail)
    return JSONResponse(view, status_code=201)


@router.post("/passkeys/{credential_id}/remove")
async def remove(request: Request, credential_id: str, user: UserDep,
                 csrf_token: Annotated[str, Form(max_length=128)] = "") -> Response:
    """Remove one of the signed-in person's passkeys (logged ``passkey.removed``)."""
    if not check_csrf(request, csrf_token):
        return csrf_refused(request)
    deps = context(request)
    try:
        await passkeys.remove_credential(deps.db, deps.clock, user, credential_id)
    except CosignerError:
        return page(request, "error.html", status=404, message="No such passkey.")
    return RedirectResponse("/ui/passkeys?done=removed", status_code=303)


@router.post("/approvals/{approval_id}/signature-options")
async def signature_options(request: Request, approval_id: str, user: UserDep) -> Response:
    """``{"statement", "publicKey"}`` for signing ``{"decision": "approved"|"rejected"}``."""
    if not check_csrf(request, request.headers.get(HEADER)):
        return _problem(403, "forbidden", "This request is not valid for your session.")
    data = await _json(request)
    decision = data.get("decision") if data is not None else None
    if decision not in ("approved", "rejected"):
        return _problem(422, "invalid_decision", "decision must be approved or rejected")
    try:
        options = await signatures.begin(context(request), user, approval_id,
                                         decision=str(decision))
    except CosignerError as exc:
        return _refusal(exc)
    return JSONResponse(options)
