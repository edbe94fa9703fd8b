"""Approver pages: inbox, one request, review (POST only), history (:mod:`.lists`).

Identity comes from the session cookie only (:data:`UserDep`); the form fields are the
decision, the comment, the hash the approver saw, and the CSRF token. Every rule about who
may review is enforced by :func:`cosigner.approvals.reviews.review`, the same function the JSON API
calls; this module only renders its answer.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from cosigner.core.errors import CosignerError, Forbidden, NotFound
from cosigner.http.deps import context
from cosigner.web import lists, pages
from cosigner.web.auth import UserDep, check_csrf, csrf_refused
from cosigner.web.render import page

router = APIRouter(prefix="/ui", include_in_schema=False)

_DONE = {"approved": "You approved this request.", "rejected": "You rejected this request."}


Short = Annotated[str | None, Query(max_length=64)]


def _locale(request: Request) -> str:
    return pages.locale_of(context(request), request.headers.get("accept-language"))


@router.get("")
async def inbox(request: Request, user: UserDep, sort: Short = None, dir: Short = None,
                size: Short = None,
                cursor: Annotated[str | None, Query(max_length=2048)] = None) -> Response:
    """Pending requests this approver may review: a table sorted by ``sort`` (``expires``,
    ``created``, ``tool``) and ``dir`` (``asc``/``desc``), ``size`` rows (10..200) a page,
    paged by ``cursor``."""
    view = await lists.inbox_page(context(request), user, lists.ListParams(
        sort=sort, dir=dir, size=size, cursor=cursor), locale=_locale(request))
    return page(request, "inbox.html", wide=True, **view)


@router.get("/history")
async def history(request: Request, user: UserDep, sort: Short = None, dir: Short = None,
                  size: Short = None, status: Short = None,
                  tool: Annotated[str | None, Query(max_length=256)] = None,
                  since: Short = None, until: Short = None,
                  cursor: Annotated[str | None, Query(max_length=2048)] = None) -> Response:
    """Decided requests with who decided what, filtered by ``status``, ``tool`` and the
    decision day (``since``/``until``, ``YYYY-MM-DD`` UTC, inclusive), sorted and paged
    like the inbox (``sort``: ``decided``, ``created``, ``tool``)."""
    view = await lists.history_page(context(request), user, lists.ListParams(
        sort=sort, dir=dir, size=size, cursor=cursor, status=status, tool=tool,
        since=since, until=until), locale=_locale(request))
    return page(request, "history.html", wide=True, **view)


@router.get("/approvals/{approval_id}")
async def detail(request: Request, approval_id: str, user: UserDep,
                 done: str | None = None) -> Response:
    """One request: exact arguments (masked paths as •••), hash, reasons, progress, forms."""
    try:
        view = await pages.detail(context(request), user, approval_id,
                                  locale=_locale(request))
    except NotFound:
        return page(request, "error.html", status=404, message="No such approval request.")
    except Forbidden:
        return page(request, "error.html", status=403,
                    message="You hold none of the roles this request needs.")
    message = _DONE.get(done or "")
    return page(request, "detail.html", medium=True, a=view, message=message,
                message_kind="ok" if message else "error")


@router.post("/approvals/{approval_id}/review")
async def review(request: Request, approval_id: str, user: UserDep,
                 decision: Annotated[str, Form(max_length=16)] = "",
                 comment: Annotated[str, Form(max_length=2000)] = "",
                 args_hash: Annotated[str, Form(max_length=80)] = "",
                 csrf_token: Annotated[str, Form(max_length=128)] = "",
                 assertion: Annotated[str, Form(max_length=16384)] = "") -> Response:
    """Approve or reject (a rejection needs a comment); refusals are shown on the page.

    ``assertion``: the passkey's signature of the review statement (JSON, filled in by
    ``passkeys.js`` when the request asks for a signature)."""
    if not check_csrf(request, csrf_token):
        return csrf_refused(request)
    deps = context(request)
    try:
        await pages.review(deps, user, approval_id, decision=decision, comment=comment,
                           shown_args_hash=args_hash, assertion=assertion or None)
    except NotFound:
        return page(request, "error.html", status=404, message="No such approval request.")
    except CosignerError as exc:
        if exc.code == "step_up_required":  # back through the IdP, then to this request
            from cosigner.web.routes_oidc import step_up_page

            return step_up_page(request, user, approval_id, exc)
        try:
            view = await pages.detail(deps, user, approval_id, locale=_locale(request))
        except (NotFound, Forbidden):
            return page(request, "error.html", status=pages.status_for(exc),
                        message=pages.refusal_text(exc))
        return page(request, "detail.html", medium=True, status=pages.status_for(exc), a=view,
                    message=pages.refusal_text(exc))
    return RedirectResponse(f"/ui/approvals/{approval_id}?done={decision}", status_code=303)
