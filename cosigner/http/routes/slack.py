"""Slack's interactivity endpoint (the Request URL of the Slack app's Interactivity).

Not part of the client API (no API key: Slack signs each request with the app's signing
secret; :mod:`cosigner.slack.interactions` checks it before reading the body), so it is
left out of ``openapi.yaml``. Slack waits 3 s: the answer leaves as soon as the database
work is done, and the Web API calls (ephemeral answers, the reject modal, the message
update) run right after it.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTasks

from cosigner.http.deps import context
from cosigner.http.problems import problem
from cosigner.slack import interactions

router = APIRouter()
log = logging.getLogger("cosigner.slack")


@router.post("/v1/slack/interactions", include_in_schema=False)
async def post_slack_interaction(request: Request) -> Response:
    """One Slack interaction (``application/x-www-form-urlencoded``, field ``payload``).

    200 (empty, or ``{"response_action": "errors", ...}`` for a modal); 401
    ``slack_unsigned``/``slack_stale``/``slack_bad_signature``; 400 ``slack_bad_payload``;
    403 ``slack_unknown_team``; 413 ``payload_too_large``.
    """
    deps = context(request)
    limit = deps.settings.max_body_bytes
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return problem(413, "payload_too_large", "Body too large",
                           f"the body exceeds {limit} bytes")
    try:
        answer = await interactions.handle(deps, body, request.headers)
    except interactions.SlackRefused as exc:
        client = request.client.host if request.client else "unknown"
        log.warning("slack interaction refused: %s (%s) from %s", exc.code, exc.detail, client)
        return problem(exc.status, exc.code, "Slack request refused", exc.detail)
    background = BackgroundTasks()
    for followup in answer.followups:
        background.add_task(followup)
    sync = getattr(request.app.state.tasks, "slack_sync", None)
    if answer.changed and sync is not None:
        background.add_task(sync.run_once)
    if answer.body is not None:
        return JSONResponse(answer.body, background=background)
    return Response(status_code=200, background=background)
