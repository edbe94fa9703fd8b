"""Slack's interactivity requests: button clicks and the reject modal's submission.

Order of checks, each refusal answered and recorded before anything else happens:

1. **Signature**, before the body is parsed (:mod:`cosigner.slack.signatures`).
   Unsigned, stale or badly signed: 401 (:class:`SlackRefused`), a warning in the app log
   only (no tenant is known, and an anonymous sender must not write to any chain).
2. **Tenant**: the workspace (``team.id``) of the payload must be the one configured for a
   tenant whose secret verified it; otherwise 403 ``slack_unknown_team``, logged in the
   ``_system`` chain (the sender held a signing secret: it is Slack, or has its secret).
3. **Person**: the Slack user's link in *that* tenant (:mod:`cosigner.slack.links`);
   unlinked, they get a one-time link URL; a disabled principal is refused, and so is one
   whose last web sign-in is older than ``settings.slack_signin_max_age`` (code
   ``slack_signin_stale``: they get a sign-in link, and signing in confirms their roles
   at the identity provider).
4. **Review**: :func:`cosigner.approvals.reviews.review`, the function of the API and the
   pages, with a :class:`Caller` for the linked principal (``authn`` ``slack``): every
   separation-of-duties rule, tenant check and quorum applies and it logs its own events.
   A request whose requirement asks for step-up or a signature (:data:`WEB_ONLY_KEYS`),
   or a review refused with ``step_up_required``/``signature_required``, sends the person
   to the web page.

Refusals outside the review are ``slack.interaction_refused`` events in the tenant's chain.
Slack waits 3 s for the answer: the database work happens in the request, the Web API
calls (ephemeral answers, the modal) in :attr:`Answer.followups`, after the response.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from cosigner.approvals.requests import load
from cosigner.approvals.reviews import review
from cosigner.audit.chain import Event, append
from cosigner.core.errors import CosignerError, Forbidden, InvalidRequest
from cosigner.core.roles import SYSTEM_TENANT
from cosigner.identity.principals import Caller
from cosigner.slack import answers, blocks, links, payloads
from cosigner.slack.answers import Answer, FollowUp
from cosigner.slack.api import SlackApi
from cosigner.slack.links import SlackUser
from cosigner.slack.payloads import Interaction
from cosigner.slack.signatures import SlackRefused, verified_tenants

if TYPE_CHECKING:
    from cosigner.context import AppContext

__all__ = ["WEB_ONLY_KEYS", "Answer", "SlackRefused", "handle"]

#: Requirement keys that need a web session (step-up, signed reviews): not from Slack.
WEB_ONLY_KEYS = ("assurance", "min_acr", "max_auth_age_s", "signature")

Say = Callable[[str], FollowUp]


async def handle(deps: AppContext, body: bytes, headers: Mapping[str, str]) -> Answer:
    """Verify, then act on one interactivity request (``payload=`` form field).

    :attr:`Answer.changed` says a review was recorded (the message sync may run sooner).

    Raises:
        SlackRefused: steps 1 and 2 of the module docstring (and 400
            ``slack_bad_payload`` for a signed body that is not an interaction of the
            shape Slack documents: :mod:`cosigner.slack.payloads`).
    """
    tenants = verified_tenants(deps.settings, deps.clock, body, headers)
    sent = payloads.parse(body)
    user, kind = sent.user, sent.kind
    tenant = next((t for t in tenants if deps.settings.slack[t].team_id == user.team_id),
                  None)
    if tenant is None:
        await _record(deps, SYSTEM_TENANT, user.actor(), "slack_unknown_team", user,
                      action=kind)
        raise SlackRefused("slack_unknown_team", "this Slack workspace serves no tenant",
                           status=403)
    api = SlackApi.for_tenant(deps.settings, tenant)
    assert api is not None  # the tenant was found among the configured ones
    if kind == "block_actions":
        return await _clicked(deps, api, tenant, sent)
    if kind == "view_submission" and sent.callback_id == blocks.REJECT:
        return await _reject_submitted(deps, api, tenant, sent)
    return Answer()  # other interactions (the link button, a closed modal): nothing to do


async def _clicked(deps: AppContext, api: SlackApi, tenant: str, sent: Interaction
                   ) -> Answer:
    user, action_id, approval_id = sent.user, sent.action_id, sent.value
    channel = sent.channel
    if action_id not in (blocks.APPROVE, blocks.REJECT):
        return Answer()  # "Open in Cosigner" is a link; Slack still reports the click
    say = answers.ephemeral(api, channel, user.user_id)
    caller = await _linked(deps, tenant, user, action_id, approval_id, say)
    if isinstance(caller, Answer):
        return caller
    row = await _request(deps, tenant, approval_id)
    if row is not None and _web_only(row.requirement):
        return await _to_web(deps, caller, user, approval_id, action_id, say)
    if action_id == blocks.REJECT:
        if row is None:
            await _record(deps, tenant, caller.actor(), "not_found", user, action=action_id,
                          approval_id=approval_id)
            return Answer(followups=[say(answers.REFUSALS["not_found"])])
        modal = blocks.reject_modal(approval_id, str(row.tool), channel=channel or None)
        trigger = sent.trigger_id
        return Answer(followups=[answers.guarded(lambda: api.open_view(trigger, modal))])
    try:
        state = await review(deps, caller, approval_id, decision="approved", comment="")
    except CosignerError as exc:
        await _record_invalid(deps, caller, user, exc, approval_id, action_id)
        return Answer(followups=[say(answers.refusal_text(exc, _page(deps, approval_id)))])
    return Answer(followups=[say(answers.approved_text(state))], changed=True)


async def _reject_submitted(deps: AppContext, api: SlackApi, tenant: str,
                            sent: Interaction) -> Answer:
    user = sent.user
    try:
        meta = json.loads(sent.metadata or "{}")
        approval_id, channel = str(meta["approval_id"]), str(meta.get("channel") or "")
    except (ValueError, KeyError, TypeError, AttributeError):
        return answers.modal_error("This form is not valid any more; click Reject again.")
    say = answers.ephemeral(api, channel, user.user_id)
    caller = await _linked(deps, tenant, user, "view_submission", approval_id, say)
    if isinstance(caller, Answer):
        return answers.modal_error("Not recorded: see the message from Cosigner.",
                                   followups=caller.followups)
    row = await _request(deps, tenant, approval_id)
    if row is not None and _web_only(row.requirement):
        moved = await _to_web(deps, caller, user, approval_id, "view_submission", say)
        return answers.modal_error(answers.web_only_text(None), followups=moved.followups)
    try:
        await review(deps, caller, approval_id, decision="rejected",
                     comment=sent.reason.strip())
    except CosignerError as exc:
        await _record_invalid(deps, caller, user, exc, approval_id, "view_submission")
        followups = [say(answers.refusal_text(exc, _page(deps, approval_id)))] \
            if exc.code in answers.WEB_ONLY_CODES else []
        return answers.modal_error(answers.refusal_text(exc, None), followups=followups)
    return Answer(followups=[say("You rejected this request; the reason is recorded.")]
                  if channel else [], changed=True)


# --- steps --------------------------------------------------------------------------------


async def _linked(deps: AppContext, tenant: str, user: SlackUser, action: str,
                  approval_id: str, say: Say) -> Caller | Answer:
    """The linked :class:`Caller`, or the :class:`Answer` for an unlinked or disabled one."""
    provider = deps.settings.oidc.get(tenant)
    now = deps.clock()
    try:
        caller = await links.caller_for(
            deps.db, tenant, user,
            signed_in_after=now - timedelta(seconds=deps.settings.slack_signin_max_age),
            passwords_allowed=provider is None or provider.allow_passwords)
    except Forbidden as exc:
        await _record(deps, tenant, user.actor(), exc.code, user, action=action,
                      approval_id=approval_id)
        if exc.code == "slack_signin_stale":
            url = answers.signin_url(deps.settings.public_url, tenant, approval_id,
                                     sso=provider is not None)
            return Answer(followups=[say(answers.signin_stale_text(url))])
        return Answer(followups=[say(answers.REFUSALS["principal_disabled"])])
    if caller is not None:
        return caller
    token, expires = await links.issue_token(
        deps.db, tenant=tenant, user=user, now=now, ttl_s=deps.settings.slack_link_ttl_s,
        secret=deps.settings.slack[tenant].signing_secret.get_secret_value())
    await _record(deps, tenant, user.actor(), "slack_not_linked", user, action=action,
                  approval_id=approval_id)
    url = links.link_url(deps.settings.public_url, token)
    left_s = int((expires - now).total_seconds())
    return Answer(followups=[say(answers.link_text(url, left_s))])


def _web_only(requirement: dict[str, Any]) -> bool:
    return any(key in requirement for key in WEB_ONLY_KEYS)


async def _to_web(deps: AppContext, caller: Caller, user: SlackUser, approval_id: str,
                  action: str, say: Say) -> Answer:
    """Send the person to the web page (step-up or a signature is required), logged."""
    await _record(deps, caller.tenant, caller.actor(), "step_up_required", user,
                  action=action, approval_id=approval_id)
    return Answer(followups=[say(answers.web_only_text(_page(deps, approval_id)))])


async def _request(deps: AppContext, tenant: str, approval_id: str) -> Any:
    """The request row in ``tenant``, or ``None`` (the review then refuses and logs)."""
    async with deps.db.read() as conn:
        return await load(conn, tenant, approval_id, lock=False)


async def _record_invalid(deps: AppContext, caller: Caller, user: SlackUser,
                          exc: CosignerError, approval_id: str, action: str) -> None:
    """Record refusals the review raises before writing its own event (a missing or too
    long reason); the review function logs every other refusal itself."""
    if isinstance(exc, InvalidRequest):
        await _record(deps, caller.tenant, caller.actor(), exc.code, user, action=action,
                      approval_id=approval_id)


async def _record(deps: AppContext, tenant: str, actor: dict[str, Any], code: str,
                  user: SlackUser, *, action: str, approval_id: str | None = None) -> None:
    """Log a ``slack.interaction_refused`` event in ``tenant``'s chain."""
    event = Event(type="slack.interaction_refused", actor=actor,
                  approval_id=approval_id or None,
                  payload={"code": code, "action": action, "team_id": user.team_id,
                           "user_id": user.user_id, "authn": links.SLACK_AUTHN.record()})
    async with deps.db.transaction() as conn:
        await append(conn, tenant, [event], now=deps.clock())


def _page(deps: AppContext, approval_id: str) -> str:
    return answers.page_url(deps.settings.public_url, approval_id)
