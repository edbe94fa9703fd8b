"""Approver pages: inbox, one request, review (POST only), history.

Identity comes from the session cookie only (:data:`UserDep`); the form fields are the
decision, the comment, the hash the approver saw, and the CSRF token. Every rule about who
may review is enforced by :func:`cosigner.approvals.reviews.review`, the same function the JSON API
calls; this module only renders its answer.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from cosigner.core.errors import CosignerError, Forbidden, NotFound
from cosigner.http.deps import context
from cosigner.web import pages
from cosigner.web.auth import UserDep, check_csrf
from cosigner.web.render import page

router = APIRouter(prefix="/ui", include_in_schema=False)

_DONE = {"approved": "You approved this request.", "rejected": "You rejected this request."}


@router.get("")
async def inbox(request: Request, user: UserDep) -> Response:
    """Pending requests this approver may review, soonest expiry first."""
    items = await pages.inbox_items(context(request), user)
    return page(request, "inbox.html", items=items)


@router.get("/history")
async def history(request: Request, user: UserDep) -> Response:
    """Decided requests of the tenant with who decided what."""
    items = await pages.history_items(context(request), user)
    return page(request, "history.html", items=items)


@router.get("/approvals/{approval_id}")
async def detail(request: Request, approval_id: str, user: UserDep,
                 done: str | None = None) -> Response:
    """One request: exact arguments (masked paths as •••), hash, reasons, progress, forms."""
    try:
        view = await pages.detail(context(request), user, approval_id)
    except NotFound:
        return page(request, "error.html", status=404, message="No such approval request.")
    except Forbidden:
        return page(request, "error.html", status=403,
                    message="You hold none of the roles this request needs.")
    message = _DONE.get(done or "")
    return page(request, "detail.html", a=view, message=message,
                message_kind="ok" if message else "error")


@router.post("/approvals/{approval_id}/review")
async def review(request: Request, approval_id: str, user: UserDep,
                 decision: Annotated[str, Form(max_length=16)] = "",
                 comment: Annotated[str, Form(max_length=2000)] = "",
                 args_hash: Annotated[str, Form(max_length=80)] = "",
                 csrf_token: Annotated[str, Form(max_length=128)] = "") -> Response:
    """Approve or reject (a rejection needs a comment); refusals are shown on the page."""
    if not check_csrf(request, csrf_token):
        return page(request, "error.html", status=403,
                    message="This form is not valid for your session. Nothing was changed.")
    deps = context(request)
    try:
        await pages.review(deps, user, approval_id, decision=decision, comment=comment,
                           shown_args_hash=args_hash)
    except NotFound:
        return page(request, "error.html", status=404, message="No such approval request.")
    except CosignerError as exc:
        if exc.code == "step_up_required":  # back through the IdP, then to this request
            from cosigner.web.routes_oidc import step_up_page

            return step_up_page(request, user, approval_id, exc)
        try:
            view = await pages.detail(deps, user, approval_id)
        except (NotFound, Forbidden):
            return page(request, "error.html", status=pages.status_for(exc),
                        message=pages.refusal_text(exc))
        return page(request, "detail.html", status=pages.status_for(exc), a=view,
                    message=pages.refusal_text(exc))
    return RedirectResponse(f"/ui/approvals/{approval_id}?done={decision}", status_code=303)
