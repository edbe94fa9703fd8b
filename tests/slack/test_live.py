"""A real ``cosigner serve`` with Slack configured: its background loop posts a new request
to the Web API stand-in and updates the message when the request is approved through the
API; its interactivity endpoint refuses an unsigned click over real HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from tests.e2e.helpers import make_keys
from tests.slack.conftest import click, workspace
from tests.slack.standin import SlackStandIn
from tests.web.conftest import refund_request


def _wait_for(condition: Any, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_a_live_server_posts_and_updates_through_its_loop(
        live_server_factory: Any, database_url: str, tenant: str,
        slack: SlackStandIn) -> None:
    server = live_server_factory(COSIGNER_SLACK=json.dumps({tenant: workspace()}),
                                 COSIGNER_SLACK_API_URL=slack.url, COSIGNER_SLACK_POLL_S="0.2")
    keys = asyncio.run(make_keys(database_url, tenant, {
        "runtime": (["runtime"], "agent-runtime"), "finance": (["finance"], "fiona")}))
    decision = httpx.post(server.url + "/v1/decisions", json=refund_request(),
                          headers={"Authorization": keys["runtime"]}).json()
    approval_id = decision["approval"]["id"]
    _wait_for(lambda: slack.of("chat.postMessage"))
    [posted] = slack.of("chat.postMessage")
    assert approval_id in json.dumps(posted.body["blocks"])

    unsigned = httpx.post(server.url + "/v1/slack/interactions", data={
        "payload": json.dumps(click("cosigner_approve", approval_id, user="U0X"))})
    assert (unsigned.status_code, unsigned.json()["code"]) == (401, "slack_unsigned")

    reviewed = httpx.post(server.url + f"/v1/approvals/{approval_id}/reviews",
                          headers={"Authorization": keys["finance"]},
                          json={"decision": "approved", "comment": "ok"})
    assert reviewed.status_code == 200, reviewed.text
    _wait_for(lambda: slack.of("chat.update"))
    [updated] = slack.of("chat.update")
    assert "Approved" in updated.body["text"] and updated.body["ts"] in slack.messages
    assert len(slack.of("chat.postMessage")) == 1
