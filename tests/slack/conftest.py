"""Slack test helpers: the Web API stand-in, a Slack-enabled app, signed interactivity
payloads built like Slack's (``v0`` HMAC-SHA256 of ``v0:{ts}:{body}``), and linking a
Slack user through the real link flow."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest

from tests.slack.standin import CHANNEL_ID, SlackStandIn
from tests.web.conftest import add_user, csrf_of, sign_in, web_client

BOT_TOKEN = "xoxb-test-0000-cosigner"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TEAM = "T0ACME"


@pytest.fixture
def slack() -> Iterator[SlackStandIn]:
    standin = SlackStandIn(token=BOT_TOKEN)
    standin.start()
    yield standin
    standin.stop()


def workspace(team: str = TEAM, secret: str = SIGNING_SECRET,
              channel: str = "#approvals") -> dict[str, str]:
    return {"bot_token": BOT_TOKEN, "signing_secret": secret, "team_id": team,
            "channel": channel}


async def slack_app(harness_factory: Any, standin: SlackStandIn, tenant: str,
                    **overrides: Any) -> Any:
    """A harness whose ``tenant`` posts to the stand-in; the sync loop is left to the test
    (``h.tasks.slack_sync.run_once()``)."""
    settings: dict[str, Any] = {"slack": {tenant: workspace()}, "slack_api_url": standin.url,
                                "slack_poll_s": 60}
    settings.update(overrides)
    return await harness_factory(**settings)


def signed(payload: dict[str, Any], *, at: float, secret: str = SIGNING_SECRET
           ) -> tuple[bytes, dict[str, str]]:
    """The form body and headers Slack sends for ``payload``, signed at ``at`` (epoch s)."""
    body = urlencode({"payload": json.dumps(payload)}).encode()
    ts = str(int(at))
    digest = hmac.new(secret.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256)
    return body, {"content-type": "application/x-www-form-urlencoded",
                  "x-slack-request-timestamp": ts, "x-slack-signature": "v0=" + digest.hexdigest()}


def click(action_id: str, approval_id: str, *, user: str, name: str = "",
          team: str = TEAM) -> dict[str, Any]:
    """A ``block_actions`` payload of a button in the channel message."""
    return {
        "type": "block_actions",
        "user": {"id": user, "username": name or user.lower(), "name": name or user.lower(),
                 "team_id": team},
        "api_app_id": "A0COSIGNER", "token": "legacy-verification-token",
        "container": {"type": "message", "message_ts": "1.000001", "channel_id": CHANNEL_ID,
                      "is_ephemeral": False},
        "trigger_id": "1337.42.d3adb33f",
        "team": {"id": team, "domain": "acme"},
        "enterprise": None, "is_enterprise_install": False,
        "channel": {"id": CHANNEL_ID, "name": "approvals"},
        "response_url": "https://hooks.slack.com/actions/T0ACME/1/xyz",
        "actions": [{"action_id": action_id, "block_id": "cosigner_review",
                     "text": {"type": "plain_text", "text": action_id}, "value": approval_id,
                     "type": "button", "action_ts": "1700000000.000100"}],
    }


def reject_submission(view: dict[str, Any], reason: str, *, user: str,
                      team: str = TEAM) -> dict[str, Any]:
    """The ``view_submission`` of the reject modal ``view`` (as ``views.open`` got it)."""
    return {
        "type": "view_submission", "team": {"id": team, "domain": "acme"},
        "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": team},
        "api_app_id": "A0COSIGNER", "token": "legacy-verification-token",
        "trigger_id": "1337.43.abc",
        "view": {**view, "id": "V0MODAL1", "team_id": team,
                 "state": {"values": {"reason": {"reason": {
                     "type": "plain_text_input", "value": reason}}}}},
    }


async def post(h: Any, payload: dict[str, Any], **kwargs: Any) -> Any:
    at = kwargs.pop("at", None) or h.context.clock().timestamp()
    body, headers = signed(payload, at=at, **kwargs)
    return await h.client.post("/v1/slack/interactions", content=body, headers=headers)


def ephemerals(slack: SlackStandIn, user: str) -> list[str]:
    return [c.body["text"] for c in slack.of("chat.postEphemeral") if c.body["user"] == user]


def link_path(text: str) -> str:
    match = re.search(r"<(https?://[^|>]+/ui/slack/link/[^|>]+)\|", text)
    assert match, text
    return urlsplit(match.group(1)).path


async def link_user(h: Any, slack: SlackStandIn, tenant: str, *, slack_user: str,
                    name: str, roles: tuple[str, ...], team: str = TEAM) -> None:
    """Make ``name`` (a new web account with ``roles``) and link ``slack_user`` to it:
    an unlinked click gets the URL, the signed-in person confirms it."""
    await add_user(h.db, tenant, name, *roles)
    answer = await post(h, click("cosigner_approve", "none", user=slack_user, team=team))
    assert answer.status_code == 200, answer.text
    path = link_path(ephemerals(slack, slack_user)[-1])
    async with web_client(h) as client:
        assert (await sign_in(client, tenant, name)).status_code == 303
        form = await client.get(path)
        assert form.status_code == 200 and slack_user in form.text, form.text
        done = await client.post(path, data={"csrf_token": csrf_of(form.text)})
        assert done.status_code == 200 and 'id="slack-linked"' in done.text, done.text
