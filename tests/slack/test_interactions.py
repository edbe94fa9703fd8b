"""Slack clicks: signed interactivity requests reach the one review function as the linked
principal, with every rule of the API and the pages; anything unsigned, stale or badly
signed changes nothing."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update

from cosigner.core.clock import FrozenClock
from cosigner.core.roles import SYSTEM_TENANT
from cosigner.db.tables import audit_events
from cosigner.db.tables_approvals import approvals, reviews
from cosigner.db.tables_slack import slack_link_tokens, slack_links
from tests.slack.conftest import (
    SIGNING_SECRET,
    TEAM,
    click,
    ephemerals,
    link_path,
    link_user,
    post,
    reject_submission,
    signed,
    slack_app,
    workspace,
)
from tests.slack.standin import CHANNEL_ID, SlackStandIn
from tests.web.conftest import add_user, csrf_of, refund_request, sign_in, web_client


async def _open(h: Any, tenant: str, amount: int = 150_000) -> tuple[str, dict[str, str]]:
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    decision = (await h.client.post("/v1/decisions", json=refund_request(amount),
                                    headers=runtime)).json()
    assert decision["effect"] == "require_approval", decision
    return str(decision["approval"]["id"]), runtime


async def _status(h: Any, approval_id: str) -> str:
    async with h.db.read() as conn:
        return str((await conn.execute(select(approvals.c.status).where(
            approvals.c.id == approval_id))).scalar_one())


async def _events(h: Any, tenant: str, kind: str | None = None) -> list[dict[str, Any]]:
    query = select(audit_events.c.body).where(audit_events.c.tenant == tenant)
    if kind is not None:
        query = query.where(audit_events.c.type == kind)
    async with h.db.read() as conn:
        return [json.loads(b) for b in (await conn.execute(
            query.order_by(audit_events.c.seq))).scalars()]


async def test_a_linked_approver_approves_and_the_permit_redeems(
        harness_factory: Any, tenant: str, slack: SlackStandIn) -> None:
    h = await slack_app(harness_factory, slack, tenant)
    approval_id, runtime = await _open(h, tenant)
    await h.tasks.slack_sync.run_once()
    await link_user(h, slack, tenant, slack_user="U0FIONA", name="fiona", roles=("finance",))

    answer = await post(h, click("cosigner_approve", approval_id, user="U0FIONA"))
    assert answer.status_code == 200 and answer.content == b""
    assert await _status(h, approval_id) == "approved"
    assert "permit is minted" in ephemerals(slack, "U0FIONA")[-1]
    [reviewed] = [e for e in await _events(h, tenant, "approval.reviewed")]
    assert reviewed["actor"]["subject"] == "fiona"
    # The permit the Slack click minted redeems like any other.
    state = (await h.client.get(f"/v1/approvals/{approval_id}", headers=runtime)).json()
    redeemed = await h.client.post("/v1/permits/redeem", headers=runtime, json={
        "permit": state["permit"]["token"], "tool": "issue_refund",
        "args": refund_request()["args"]})
    assert redeemed.status_code == 200, redeemed.text
    # The click ran the message sync: the channel message shows the outcome, no buttons.
    [update_call] = slack.of("chat.update")
    assert "Approved" in update_call.body["text"]
    assert not [b for b in update_call.body["blocks"] if b["type"] == "actions"]


async def test_self_approval_and_a_missing_role_are_refused_with_a_message(
        harness_factory: Any, tenant: str, slack: SlackStandIn) -> None:
    h = await slack_app(harness_factory, slack, tenant)
    approval_id, _ = await _open(h, tenant)
    # The call's initiator holds finance too: separation of duties refuses them.
    await link_user(h, slack, tenant, slack_user="U0AGENT", name="agent-support",
                    roles=("finance",))
    await link_user(h, slack, tenant, slack_user="U0SAM", name="sam", roles=("security",))
    for user, code in (("U0AGENT", "self_approval"), ("U0SAM", "not_eligible")):
        answer = await post(h, click("cosigner_approve", approval_id, user=user))
        assert answer.status_code == 200
        assert code in ephemerals(slack, user)[-1]
    assert await _status(h, approval_id) == "pending"
    refused = await _events(h, tenant, "approval.review_refused")
    assert [(e["actor"]["subject"], e["payload"]["code"]) for e in refused] == [
        ("agent-support", "self_approval"), ("sam", "not_eligible")]


async def test_unsigned_badly_signed_and_stale_clicks_change_nothing(
        harness_factory: Any, tenant: str, slack: SlackStandIn) -> None:
    h = await slack_app(harness_factory, slack, tenant)
    approval_id, _ = await _open(h, tenant)
    await link_user(h, slack, tenant, slack_user="U0FIONA", name="fiona", roles=("finance",))
    before = (len(slack.calls), len(await _events(h, tenant)),
              len(await _events(h, SYSTEM_TENANT, "slack.interaction_refused")))
    payload = click("cosigner_approve", approval_id, user="U0FIONA")
    now = h.context.clock().timestamp()
    body, headers = signed(payload, at=now)
    cases = {
        "slack_unsigned": {"content-type": headers["content-type"]},
        "slack_bad_signature": {**headers, "x-slack-signature": "v0=" + "0" * 64},
        "slack_stale": signed(payload, at=now - 301)[1],
    }
    wrong_secret = signed(payload, at=now, secret="another-apps-signing-secret")
    for code, sent in (*cases.items(), ("slack_bad_signature", wrong_secret[1])):
        answer = await h.client.post("/v1/slack/interactions", content=body, headers=sent)
        assert (answer.status_code, answer.json()["code"]) == (401, code), code
    # A signed body edited after signing fails too.
    tampered = body.replace(b"U0FIONA", b"U0MALLO")
    answer = await h.client.post("/v1/slack/interactions", content=tampered, headers=headers)
    assert answer.json()["code"] == "slack_bad_signature"
    assert await _status(h, approval_id) == "pending"
    # Anonymous: the app log has them, no chain does.
    assert (len(slack.calls), len(await _events(h, tenant)),
            len(await _events(h, SYSTEM_TENANT, "slack.interaction_refused"))) == before
    # The genuine request still works.
    assert (await h.client.post("/v1/slack/interactions", content=body,
                                headers=headers)).status_code == 200
    assert await _status(h, approval_id) == "approved"


async def test_an_unlinked_user_gets_a_one_time_link(harness_factory: Any, tenant: str,
                                                     slack: SlackStandIn) -> None:
    h = await slack_app(harness_factory, slack, tenant)
    approval_id, _ = await _open(h, tenant)
    answer = await post(h, click("cosigner_approve", approval_id, user="U0NEW"))
    assert answer.status_code == 200
    assert await _status(h, approval_id) == "pending"
    path = link_path(ephemerals(slack, "U0NEW")[-1])
    token = path.rsplit("/", 1)[-1]
    async with h.db.read() as conn:
        stored = (await conn.execute(select(slack_link_tokens).where(
            slack_link_tokens.c.tenant == tenant))).all()
    assert [(r.team_id, r.user_id) for r in stored] == [(TEAM, "U0NEW")]
    assert stored[0].token_hash != token and len(stored[0].token_hash) == 64  # hashed
    [refused] = await _events(h, tenant, "slack.interaction_refused")
    assert refused["payload"]["code"] == "slack_not_linked"

    await add_user(h.db, tenant, "fiona", "finance")
    async with web_client(h) as client:
        # Signed out: the link page sends to sign-in first, and back.
        first = await client.get(path)
        assert first.status_code == 303 and first.headers["location"].endswith(path)
        await sign_in(client, tenant, "fiona")
        form = await client.get(path)
        assert "U0NEW" in form.text and "fiona" in form.text
        no_csrf = await client.post(path, data={"csrf_token": "0" * 64})
        assert no_csrf.status_code == 403
        done = await client.post(path, data={"csrf_token": csrf_of(form.text)})
        assert done.status_code == 200 and 'id="slack-linked"' in done.text
        again = await client.post(path, data={"csrf_token": csrf_of(form.text)})
        assert again.status_code == 404  # single use
    async with h.db.read() as conn:
        assert (await conn.execute(select(func.count()).select_from(slack_links).where(
            slack_links.c.tenant == tenant))).scalar_one() == 1
    assert len(await _events(h, tenant, "slack.linked")) == 1
    assert (await post(h, click("cosigner_approve", approval_id, user="U0NEW"))
            ).status_code == 200
    assert await _status(h, approval_id) == "approved"


async def test_a_link_url_and_a_link_stay_in_their_tenant(
        harness_factory: Any, tenant: str, slack: SlackStandIn) -> None:
    other = tenant + "-b"
    h = await slack_app(harness_factory, slack, tenant, slack={
        tenant: workspace(), other: workspace(team="T0OTHER")})
    await link_user(h, slack, tenant, slack_user="U0FIONA", name="fiona", roles=("finance",))
    approval_id, _ = await _open(h, other)
    # The same Slack user id in the other tenant's workspace is not linked there.
    answer = await post(h, click("cosigner_approve", approval_id, user="U0FIONA",
                                 team="T0OTHER"))
    assert answer.status_code == 200 and await _status(h, approval_id) == "pending"
    path = link_path(ephemerals(slack, "U0FIONA")[-1])
    # That link URL, opened by tenant's fiona, is refused: it belongs to the other tenant.
    async with web_client(h) as client:
        await sign_in(client, tenant, "fiona")
        assert (await client.get(path)).status_code == 403
    # And fiona's click in her own workspace never reaches the other tenant's request.
    answer = await post(h, click("cosigner_approve", approval_id, user="U0FIONA"))
    assert answer.status_code == 200 and await _status(h, approval_id) == "pending"
    assert "not_found" in ephemerals(slack, "U0FIONA")[-1]


async def test_reject_opens_a_modal_that_requires_a_reason(
        harness_factory: Any, tenant: str, slack: SlackStandIn) -> None:
    h = await slack_app(harness_factory, slack, tenant)
    approval_id, _ = await _open(h, tenant)
    await h.tasks.slack_sync.run_once()
    await link_user(h, slack, tenant, slack_user="U0FIONA", name="fiona", roles=("finance",))
    answer = await post(h, click("cosigner_reject", approval_id, user="U0FIONA"))
    assert answer.status_code == 200
    [opened] = slack.of("views.open")
    assert opened.body["trigger_id"] == "1337.42.d3adb33f"
    view = opened.body["view"]
    assert view["callback_id"] == "cosigner_reject"
    assert await _status(h, approval_id) == "pending"

    empty = await post(h, reject_submission(view, "   ", user="U0FIONA"))
    assert empty.status_code == 200
    assert empty.json() == {"response_action": "errors",
                            "errors": {"reason": "Not recorded: A reason is required to "
                                                 "reject. (comment_required)"}}
    assert await _status(h, approval_id) == "pending"
    refused = (await _events(h, tenant, "slack.interaction_refused"))[-1]
    assert (refused["payload"]["code"], refused["actor"]["subject"]) == (
        "comment_required", "fiona")

    done = await post(h, reject_submission(view, "customer already refunded",
                                           user="U0FIONA"))
    assert done.status_code == 200 and done.content == b""
    assert await _status(h, approval_id) == "rejected"
    async with h.db.read() as conn:
        comment = (await conn.execute(select(reviews.c.comment).where(
            reviews.c.approval_id == approval_id))).scalar_one()
    assert comment == "customer already refunded"
    [update_call] = slack.of("chat.update")
    assert "Rejected" in update_call.body["text"]
    assert "customer already refunded" in json.dumps(update_call.body["blocks"])


async def test_a_step_up_requirement_sends_the_person_to_the_web_page(
        harness_factory: Any, tenant: str, slack: SlackStandIn) -> None:
    h = await slack_app(harness_factory, slack, tenant)
    approval_id, _ = await _open(h, tenant)
    await link_user(h, slack, tenant, slack_user="U0FIONA", name="fiona", roles=("finance",))
    async with h.db.transaction() as conn:  # as a policy asking for MFA would store it
        row = (await conn.execute(select(approvals.c.requirement).where(
            approvals.c.id == approval_id))).scalar_one()
        await conn.execute(update(approvals).where(approvals.c.id == approval_id).values(
            requirement={**row, "assurance": "mfa", "max_auth_age_s": 300}))
    answer = await post(h, click("cosigner_approve", approval_id, user="U0FIONA"))
    assert answer.status_code == 200
    assert await _status(h, approval_id) == "pending"
    text = ephemerals(slack, "U0FIONA")[-1]
    assert f"/ui/approvals/{approval_id}|" in text and "stronger sign-in" in text
    codes = [e["payload"]["code"] for e in await _events(h, tenant, "slack.interaction_refused")]
    assert codes[-1] == "step_up_required"


async def test_a_disabled_principal_is_refused(harness_factory: Any, tenant: str,
                                               slack: SlackStandIn) -> None:
    from cosigner.db.tables import principals

    h = await slack_app(harness_factory, slack, tenant)
    approval_id, _ = await _open(h, tenant)
    await link_user(h, slack, tenant, slack_user="U0FIONA", name="fiona", roles=("finance",))
    async with h.db.transaction() as conn:
        await conn.execute(update(principals).where(
            principals.c.tenant == tenant, principals.c.subject == "fiona").values(
            disabled=True))
    assert (await post(h, click("cosigner_approve", approval_id, user="U0FIONA"))
            ).status_code == 200
    assert await _status(h, approval_id) == "pending"
    assert "disabled" in ephemerals(slack, "U0FIONA")[-1]


async def test_a_workspace_of_no_tenant_is_refused_and_logged(
        harness_factory: Any, tenant: str, slack: SlackStandIn) -> None:
    clock = FrozenClock(datetime.now(UTC))
    h = await slack_app(harness_factory, slack, tenant, clock=clock)
    approval_id, _ = await _open(h, tenant)
    before = len(await _events(h, SYSTEM_TENANT, "slack.interaction_refused"))
    answer = await post(h, click("cosigner_approve", approval_id, user="U0X", team="T0ELSE"),
                        secret=SIGNING_SECRET)
    assert (answer.status_code, answer.json()["code"]) == (403, "slack_unknown_team")
    after = await _events(h, SYSTEM_TENANT, "slack.interaction_refused")
    assert len(after) == before + 1 and after[-1]["payload"]["team_id"] == "T0ELSE"
    assert await _status(h, approval_id) == "pending" and not slack.calls


async def test_a_password_account_link_is_void_once_passwords_are_switched_off(
        harness_factory: Any, tenant: str, slack: SlackStandIn) -> None:
    """A Slack link made by a password account keeps no authority once the tenant signs
    in with single sign-on only: the click is treated as unlinked (a new link URL, which
    can only be confirmed while signed in, so through single sign-on)."""
    from cosigner.core.clock import system_clock

    only = {"issuer": "http://127.0.0.1:9/", "client_id": "cosigner", "client_secret": "s",
            "role_map": {"fin": ["finance"]}, "allow_passwords": False}
    h = await slack_app(harness_factory, slack, tenant, oidc={tenant: only})
    approval_id, _ = await _open(h, tenant)
    # Linked while passwords were still allowed (the link outlives the setting).
    principal_id = await add_user(h.db, tenant, "fiona", "finance")
    async with h.db.transaction() as conn:
        await conn.execute(slack_links.insert().values(
            tenant=tenant, team_id=TEAM, user_id="U0FIONA", user_name="fiona",
            principal_id=principal_id, created_at=system_clock()))
    answer = await post(h, click("cosigner_approve", approval_id, user="U0FIONA"))
    assert answer.status_code == 200
    assert await _status(h, approval_id) == "pending"
    assert "/ui/slack/link/" in ephemerals(slack, "U0FIONA")[-1]
    codes = [e["payload"]["code"] for e in await _events(h, tenant, "slack.interaction_refused")]
    assert codes[-1] == "slack_not_linked"


async def _signed_in_at(h: Any, tenant: str, name: str, when: datetime | None) -> None:
    from cosigner.db.tables import principals

    async with h.db.transaction() as conn:
        await conn.execute(update(principals).where(
            principals.c.tenant == tenant, principals.c.subject == name).values(
            last_signed_in_at=when))


async def test_a_link_acts_only_while_its_person_signed_in_recently(
        harness_factory: Any, tenant: str, slack: SlackStandIn) -> None:
    """Roles from single sign-on are refreshed only at a sign-in: a link whose person has
    not signed in for longer than ``slack_signin_max_age_s`` (default: the web session's
    maximum age, 12 h) approves, rejects and submits nothing; the person is sent to sign
    in, and once they have, the click works."""
    h = await slack_app(harness_factory, slack, tenant)
    approval_id, _ = await _open(h, tenant)
    await link_user(h, slack, tenant, slack_user="U0FIONA", name="fiona", roles=("finance",))
    now = h.context.clock()
    # Signed in 12 h and 1 s ago; and a link older than migration 0018 (never recorded).
    for when in (now - timedelta(hours=12, seconds=1), None):
        await _signed_in_at(h, tenant, "fiona", when)
        before = len(slack.of("views.open"))
        for action in ("cosigner_approve", "cosigner_reject"):
            answer = await post(h, click(action, approval_id, user="U0FIONA"))
            assert answer.status_code == 200 and answer.content == b""
            text = ephemerals(slack, "U0FIONA")[-1]
            assert "slack_signin_stale" in text
            assert f"/ui/login?tenant={tenant}&next=%2Fui%2Fapprovals%2F{approval_id}|" \
                in text
        assert len(slack.of("views.open")) == before  # no reject modal either
        # A reject modal opened before the sign-in went stale submits nothing.
        modal = {"callback_id": "cosigner_reject", "type": "modal",
                 "private_metadata": json.dumps({"approval_id": approval_id,
                                                 "channel": CHANNEL_ID})}
        submitted = await post(h, reject_submission(modal, "not ok", user="U0FIONA"))
        assert submitted.json()["response_action"] == "errors"
        assert await _status(h, approval_id) == "pending"
    refused = [(e["payload"]["code"], e["payload"]["action"], e["subject"]["approval_id"])
               for e in await _events(h, tenant, "slack.interaction_refused")]
    assert refused[-6:] == [("slack_signin_stale", action, approval_id) for action in (
        "cosigner_approve", "cosigner_reject", "view_submission") * 2]
    assert not await _events(h, tenant, "approval.reviewed")

    # Just inside the window it acts (the reject modal opens) ...
    await _signed_in_at(h, tenant, "fiona", now - timedelta(hours=11, minutes=59))
    assert (await post(h, click("cosigner_reject", approval_id, user="U0FIONA"))
            ).status_code == 200
    assert len(slack.of("views.open")) == 1
    # ... and after a stale spell, signing in on the web makes the link act again.
    await _signed_in_at(h, tenant, "fiona", None)
    async with web_client(h) as client:
        assert (await sign_in(client, tenant, "fiona")).status_code == 303
    answer = await post(h, click("cosigner_approve", approval_id, user="U0FIONA"))
    assert answer.status_code == 200 and await _status(h, approval_id) == "approved"


async def test_a_stale_single_sign_on_link_is_sent_to_the_identity_provider(
        harness_factory: Any, tenant: str, slack: SlackStandIn) -> None:
    """With single sign-on the sign-in link starts it (which maps the groups again), and
    the maximum age is a setting of its own."""
    sso = {"issuer": "http://127.0.0.1:9/", "client_id": "cosigner", "client_secret": "s",
           "role_map": {"fin": ["finance"]}}
    h = await slack_app(harness_factory, slack, tenant, oidc={tenant: sso},
                        slack_signin_max_age_s=600)
    approval_id, _ = await _open(h, tenant)
    await link_user(h, slack, tenant, slack_user="U0FIONA", name="fiona", roles=("finance",))
    await _signed_in_at(h, tenant, "fiona", h.context.clock() - timedelta(seconds=601))
    assert (await post(h, click("cosigner_approve", approval_id, user="U0FIONA"))
            ).status_code == 200
    assert await _status(h, approval_id) == "pending"
    assert f"/ui/oidc/start?tenant={tenant}&next=" in ephemerals(slack, "U0FIONA")[-1]


async def test_signed_payloads_of_odd_shapes_are_a_clean_400(
        harness_factory: Any, tenant: str, slack: SlackStandIn, caplog: Any) -> None:
    """Whatever shape a signed body has, a field of the wrong type is 400
    ``slack_bad_payload`` (logged), never a server error, and changes nothing."""
    import logging

    h = await slack_app(harness_factory, slack, tenant)
    approval_id, _ = await _open(h, tenant)
    await link_user(h, slack, tenant, slack_user="U0FIONA", name="fiona", roles=("finance",))
    good = click("cosigner_approve", approval_id, user="U0FIONA")
    modal = {"callback_id": "cosigner_reject", "type": "modal",
             "private_metadata": json.dumps({"approval_id": approval_id})}
    submitted = reject_submission(modal, "no", user="U0FIONA")
    shapes: dict[str, Any] = {
        "channel as a string": {**good, "channel": CHANNEL_ID},
        "actions an object": {**good, "actions": good["actions"][0]},
        "actions a string": {**good, "actions": "cosigner_approve"},
        "actions empty": {**good, "actions": []},
        "an action a list": {**good, "actions": [["cosigner_approve"]]},
        "action value an object": {**good, "actions": [{**good["actions"][0],
                                                        "value": {"id": approval_id}}]},
        "no user": {k: v for k, v in good.items() if k != "user"},
        "user a string": {**good, "user": "U0FIONA"},
        "user id a number": {**good, "user": {**good["user"], "id": 42}},
        "team a list": {**good, "team": ["T0ACME"]},
        "payload a list": [good],
        "payload a string": "block_actions",
        "view without state": {**submitted, "view": {
            k: v for k, v in submitted["view"].items() if k != "state"}},
        "view a string": {**submitted, "view": "V0MODAL1"},
        "state values a list": {**submitted, "view": {**submitted["view"],
                                                      "state": {"values": []}}},
        "reason field a string": {**submitted, "view": {**submitted["view"], "state": {
            "values": {"reason": {"reason": "no"}}}}},
    }
    caplog.set_level(logging.WARNING, logger="cosigner.slack")
    for name, shape in shapes.items():
        answer = await post(h, shape)
        assert answer.status_code == 400, (name, answer.status_code, answer.text)
        assert answer.headers["content-type"].startswith("application/problem+json"), name
        assert answer.json()["code"] == "slack_bad_payload", name
    refusals = [r for r in caplog.records if "slack_bad_payload" in r.getMessage()]
    assert len(refusals) == len(shapes)
    # A form body without a payload field, or with one that is not JSON.
    for raw in (b"other=1", b"payload=%7Bnot-json"):
        _, headers = signed({}, at=h.context.clock().timestamp())
        ts = headers["x-slack-request-timestamp"]
        headers["x-slack-signature"] = "v0=" + hmac.new(
            SIGNING_SECRET.encode(), f"v0:{ts}:".encode() + raw, hashlib.sha256).hexdigest()
        answer = await h.client.post("/v1/slack/interactions", content=raw, headers=headers)
        assert (answer.status_code, answer.json()["code"]) == (400, "slack_bad_payload")
    assert await _status(h, approval_id) == "pending"
    assert not await _events(h, tenant, "approval.review_refused")
    # The well-formed click still works.
    assert (await post(h, good)).status_code == 200
    assert await _status(h, approval_id) == "approved"


async def test_a_click_signed_in_the_future_is_stale_too(
        harness_factory: Any, tenant: str, slack: SlackStandIn) -> None:
    """The replay window is 5 minutes either way: a timestamp more than 300 s ahead of
    the server's clock is refused like one 300 s behind (a request signed ahead could
    otherwise be replayed for longer)."""
    clock = FrozenClock(datetime.now(UTC))
    h = await slack_app(harness_factory, slack, tenant, clock=clock)
    approval_id, _ = await _open(h, tenant)
    await link_user(h, slack, tenant, slack_user="U0FIONA", name="fiona", roles=("finance",))
    payload = click("cosigner_approve", approval_id, user="U0FIONA")
    ahead = await post(h, payload, at=clock().timestamp() + 301)
    assert (ahead.status_code, ahead.json()["code"]) == (401, "slack_stale")
    assert await _status(h, approval_id) == "pending"
    # Inside the window (a sender's clock slightly ahead) it is accepted.
    assert (await post(h, payload, at=clock().timestamp() + 299)).status_code == 200
    assert await _status(h, approval_id) == "approved"


async def test_clicking_again_unlinked_sends_the_same_link_and_keeps_one_row(
        harness_factory: Any, tenant: str, slack: SlackStandIn) -> None:
    """An unlinked user's clicks do not add a token row each: a live unused link (with at
    least half its lifetime left) is sent again; past that, or once spent, the user's old
    rows are replaced by one new link."""
    clock = FrozenClock(datetime.now(UTC))
    h = await slack_app(harness_factory, slack, tenant, clock=clock)
    approval_id, _ = await _open(h, tenant)

    async def rows() -> list[Any]:
        async with h.db.read() as conn:
            return list((await conn.execute(select(slack_link_tokens).where(
                slack_link_tokens.c.tenant == tenant))).all())

    paths = []
    for _ in range(5):
        assert (await post(h, click("cosigner_approve", approval_id, user="U0NEW"))
                ).status_code == 200
        paths.append(link_path(ephemerals(slack, "U0NEW")[-1]))
        clock.advance(seconds=60)
    assert len(set(paths)) == 1 and len(await rows()) == 1
    assert "valid 6 min" in ephemerals(slack, "U0NEW")[-1]  # the time actually left
    # Less than half of the 600 s left: a new link replaces the old row.
    clock.advance(seconds=60)
    assert (await post(h, click("cosigner_approve", approval_id, user="U0NEW"))
            ).status_code == 200
    fresh = link_path(ephemerals(slack, "U0NEW")[-1])
    assert fresh != paths[0] and len(await rows()) == 1
    # The replaced link no longer works; the fresh one links, once.
    await add_user(h.db, tenant, "nina", "finance")
    async with web_client(h) as client:
        await sign_in(client, tenant, "nina")
        assert (await client.get(paths[0])).status_code == 404
        form = await client.get(fresh)
        done = await client.post(fresh, data={"csrf_token": csrf_of(form.text)})
        assert done.status_code == 200 and 'id="slack-linked"' in done.text
    # Another user's clicks get their own single row.
    await post(h, click("cosigner_approve", approval_id, user="U0OTHER"))
    await post(h, click("cosigner_approve", approval_id, user="U0OTHER"))
    assert sorted(r.user_id for r in await rows() if r.used_at is None) == ["U0OTHER"]
    assert len(await rows()) == 2  # nina's spent one stays until her next issue
