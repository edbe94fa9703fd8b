"""Linking a Slack user to the signed-in approver (the one-time URL sent in Slack).

GET shows which Slack user would be linked; the POST (CSRF-checked, like every form)
confirms it through :func:`cosigner.slack.links.confirm`. Identity comes from the session
only; the token says which Slack user, and is refused outside its tenant.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import Response

from cosigner.core.errors import Forbidden, NotFound
from cosigner.http.deps import context
from cosigner.slack import links
from cosigner.web.auth import UserDep, check_csrf, csrf_refused
from cosigner.web.render import page

router = APIRouter(prefix="/ui/slack", include_in_schema=False)


@router.get("/link/{token}")
async def link_form(request: Request, token: str, user: UserDep) -> Response:
    """What the link would connect, and the confirm button."""
    deps = context(request)
    try:
        slack_user = await links.pending_link(deps.db, user, token, now=deps.clock())
    except NotFound as exc:
        return page(request, "error.html", status=404, message=exc.detail)
    except Forbidden as exc:
        return page(request, "error.html", status=403, message=exc.detail)
    return page(request, "slack_link.html", slack=slack_user, token=token, linked=False)


@router.post("/link/{token}")
async def link_confirm(request: Request, token: str, user: UserDep,
                       csrf_token: Annotated[str, Form(max_length=128)] = "") -> Response:
    """Spend the token and link its Slack user to the signed-in principal."""
    if not check_csrf(request, csrf_token):
        return csrf_refused(request)
    deps = context(request)
    try:
        slack_user = await links.confirm(deps.db, user, token, now=deps.clock())
    except NotFound as exc:
        return page(request, "error.html", status=404, message=exc.detail)
    except Forbidden as exc:
        return page(request, "error.html", status=403, message=exc.detail)
    return page(request, "slack_link.html", slack=slack_user, token=token, linked=True,
                message="Linked. Your clicks in Slack now act as you.", message_kind="ok")
