"""Slack messages: a new approval request is posted to the tenant's channel (once, even
with two replicas), retried with backoff, and updated when it is decided through the API,
cancelled or expired."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from cosigner.approvals.requests import expire_due
from cosigner.core.clock import FrozenClock
from cosigner.db.tables_slack import slack_messages
from cosigner.slack.messages import MessageSync
from tests.conftest import ROOT
from tests.slack.conftest import slack_app
from tests.slack.standin import CHANNEL_ID, SlackStandIn
from tests.web.conftest import message_request, refund_request, review_bundle


async def _open(h: Any, tenant: str, body: dict[str, Any] | None = None) -> str:
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    decision = (await h.client.post("/v1/decisions", json=body or refund_request(),
                                    headers=runtime)).json()
    assert decision["effect"] == "require_approval", decision
    return str(decision["approval"]["id"])


async def _row(h: Any, approval_id: str) -> Any:
    async with h.db.read() as conn:
        return (await conn.execute(select(slack_messages).where(
            slack_messages.c.approval_id == approval_id))).first()


def _actions(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for b in blocks if b["type"] == "actions" for e in b["elements"]]


async def test_a_new_request_is_posted_once_with_buttons(harness_factory: Any, tenant: str,
                                                         slack: SlackStandIn) -> None:
    h = await slack_app(harness_factory, slack, tenant)
    approval_id = await _open(h, tenant)
    assert await h.tasks.slack_sync.run_once() == 1
    [call] = slack.of("chat.postMessage")
    assert call.authorization == "Bearer xoxb-test-0000-cosigner"
    assert call.body["channel"] == "#approvals"
    text = json.dumps(call.body["blocks"])
    assert "issue_refund" in text and "150000" in text and "ord_8472" in text
    assert "refunds above 100000 need finance approval" in text  # the reasons
    assert "min left" in text and "finance 0/1" in text
    assert f"/ui/approvals/{approval_id}" in text  # the web page
    buttons = {b["action_id"]: b for b in _actions(call.body["blocks"])}
    assert buttons["cosigner_approve"]["value"] == approval_id
    assert buttons["cosigner_reject"]["value"] == approval_id
    row = await _row(h, approval_id)
    assert (row.state, row.channel, row.shown_status) == ("open", CHANNEL_ID, "pending")
    assert row.ts in slack.messages
    # Nothing new: nothing posted again.
    assert await h.tasks.slack_sync.run_once() == 0
    assert len(slack.of("chat.postMessage")) == 1


async def test_two_replicas_post_a_request_once(harness_factory: Any, tenant: str,
                                                slack: SlackStandIn) -> None:
    import asyncio

    h = await slack_app(harness_factory, slack, tenant)
    ids = {await _open(h, tenant, refund_request(amount_minor=150_000 + i)) for i in range(3)}
    replicas = [MessageSync(h.db, h.settings, h.context.clock) for _ in range(2)]
    done = await asyncio.gather(*(r.run_once() for r in replicas))
    assert sum(done) == 3
    posted = [b["value"] for c in slack.of("chat.postMessage") for b in _actions(c.body["blocks"])
              if b["action_id"] == "cosigner_approve"]
    assert sorted(posted) == sorted(ids)


async def test_masked_and_markup_arguments_never_reach_slack(
        harness_factory: Any, tenant: str, slack: SlackStandIn, tmp_path: Path) -> None:
    h = await slack_app(harness_factory, slack, tenant,
                        bundle_dirs=[review_bundle(tmp_path, tenant), ROOT / "policies"])
    await _open(h, tenant, message_request(
        card_number="4111111111111111", api_token="tok-very-secret",
        body="<!channel> pay <https://evil.example|here> & now"))
    await h.tasks.slack_sync.run_once()
    [call] = slack.of("chat.postMessage")
    raw = json.dumps(call.body, ensure_ascii=False)
    assert "4111111111111111" not in raw and "tok-very-secret" not in raw
    assert "•••" in raw
    # mrkdwn escaping: no mention, no link, the text still readable.
    assert "<!channel>" not in raw and "<https://evil.example" not in raw
    assert "&lt;!channel&gt; pay &lt;https://evil.example|here&gt; &amp; now" in raw


async def test_a_failed_post_is_retried_with_backoff(harness_factory: Any, tenant: str,
                                                     slack: SlackStandIn) -> None:
    clock = FrozenClock(datetime.now(UTC))
    h = await slack_app(harness_factory, slack, tenant, clock=clock)
    approval_id = await _open(h, tenant)
    slack.fail["chat.postMessage"] = 1
    assert await h.tasks.slack_sync.run_once() == 0
    row = await _row(h, approval_id)
    assert (row.state, row.attempts, row.last_error) == ("posting", 1, "ratelimited")
    assert await h.tasks.slack_sync.run_once() == 0  # not due yet
    assert len(slack.of("chat.postMessage")) == 1
    clock.advance(seconds=2)
    assert await h.tasks.slack_sync.run_once() == 1
    row = await _row(h, approval_id)
    assert (row.state, row.attempts, row.last_error) == ("open", 0, None)


async def test_the_message_follows_decision_cancel_and_expiry(
        harness_factory: Any, tenant: str, slack: SlackStandIn) -> None:
    clock = FrozenClock(datetime.now(UTC))
    h = await slack_app(harness_factory, slack, tenant, clock=clock)
    approved = await _open(h, tenant, refund_request(amount_minor=150_001))
    cancelled = await _open(h, tenant, refund_request(amount_minor=150_002))
    expired = await _open(h, tenant, refund_request(amount_minor=150_003))
    assert await h.tasks.slack_sync.run_once() == 3
    ts = {a: (await _row(h, a)).ts for a in (approved, cancelled, expired)}

    finance = await h.headers(tenant, "finance", subject="fiona")
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    reviewed = await h.client.post(f"/v1/approvals/{approved}/reviews", headers=finance,
                                   json={"decision": "approved", "comment": "ok"})
    assert reviewed.status_code == 200, reviewed.text
    assert (await h.client.post(f"/v1/approvals/{cancelled}/cancel",
                                headers=runtime)).status_code == 200
    assert await h.tasks.slack_sync.run_once() == 2
    clock.advance(minutes=31)  # the refund policy's requests live 30 min
    assert await expire_due(h.db, clock(), settings=h.settings, tenant=tenant) == 1
    assert await h.tasks.slack_sync.run_once() == 1

    updates = {c.body["ts"]: c.body for c in slack.of("chat.update")}
    assert set(updates) == set(ts.values())
    for approval_id, word in ((approved, "Approved"), (cancelled, "Cancelled"),
                              (expired, "Expired")):
        update = updates[ts[approval_id]]
        assert update["channel"] == CHANNEL_ID
        assert word in update["text"] and not _actions(update["blocks"])
        row = await _row(h, approval_id)
        assert (row.state, row.shown_status) == ("done", word.lower())
    assert "fiona" in json.dumps(updates[ts[approved]]["blocks"])
    assert await h.tasks.slack_sync.run_once() == 0  # nothing moves twice


async def test_a_failed_update_is_retried(harness_factory: Any, tenant: str,
                                          slack: SlackStandIn) -> None:
    clock = FrozenClock(datetime.now(UTC))
    h = await slack_app(harness_factory, slack, tenant, clock=clock)
    approval_id = await _open(h, tenant)
    await h.tasks.slack_sync.run_once()
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    assert (await h.client.post(f"/v1/approvals/{approval_id}/cancel",
                                headers=runtime)).status_code == 200
    slack.fail["chat.update"] = 2
    assert await h.tasks.slack_sync.run_once() == 0
    row = await _row(h, approval_id)
    assert (row.state, row.shown_status, row.attempts) == ("open", "pending", 1)
    clock.advance(seconds=2)
    assert await h.tasks.slack_sync.run_once() == 0
    assert (await _row(h, approval_id)).attempts == 2
    clock.advance(seconds=3)
    assert await h.tasks.slack_sync.run_once() == 0  # backoff: 4 s after the second failure
    clock.advance(seconds=1)
    assert await h.tasks.slack_sync.run_once() == 1
    row = await _row(h, approval_id)
    assert (row.state, row.shown_status, row.attempts) == ("done", "cancelled", 0)
    assert len(slack.of("chat.update")) == 3


async def test_an_escalation_updates_the_message_and_keeps_the_buttons(
        harness_factory: Any, tenant: str, slack: SlackStandIn, tmp_path: Path) -> None:
    from tests.http.approval_helpers import decide, scripted, write_scripted_bundle
    from tests.http.test_approval_escalation import escalating

    clock = FrozenClock(datetime.now(UTC))
    h = await slack_app(harness_factory, slack, tenant, clock=clock,
                        bundle_dirs=[write_scripted_bundle(tmp_path / "b")])
    runtime = await h.headers(tenant, "runtime")
    approval_id = (await decide(h, runtime, scripted(escalating())))["approval"]["id"]
    assert await h.tasks.slack_sync.run_once() == 1
    assert "finance 0/1" in json.dumps(slack.of("chat.postMessage")[0].body["blocks"])
    clock.advance(seconds=60)  # stage 1 (finance, 60 s) is over: manager's turn
    assert await expire_due(h.db, clock(), settings=h.settings, tenant=tenant) == 1
    assert await h.tasks.slack_sync.run_once() == 1
    [update] = slack.of("chat.update")
    shown = json.dumps(update.body["blocks"])
    assert "manager 0/1" in shown and "(stage 2)" in shown
    assert {b["action_id"] for b in _actions(update.body["blocks"])} >= {
        "cosigner_approve", "cosigner_reject"}
    row = await _row(h, approval_id)
    assert (row.state, row.shown_status, row.shown_stage) == ("open", "pending", 2)
    assert await h.tasks.slack_sync.run_once() == 0


def test_the_reject_dialog_escapes_the_tool_name_once() -> None:
    """mrkdwn needs ``&``, ``<``, ``>`` as entities exactly once: escaped twice, Slack
    would show ``&amp;lt;`` to the approver."""
    from cosigner.slack.blocks import reject_modal

    modal = reject_modal("0193-id", "pay&<go>", channel=None)
    text = modal["blocks"][0]["text"]["text"]
    assert text.startswith("Reject `pay&amp;&lt;go&gt;`?"), text
    assert "&amp;amp;" not in text and "&amp;lt;" not in text
