"""Slack's interactivity requests: button clicks and the reject modal's submission.

Order of checks, each refusal answered and recorded before anything else happens:

1. **Signature** (before the body is parsed): ``X-Slack-Request-Timestamp`` within 5 min
   of now and ``X-Slack-Signature`` = ``v0=`` HMAC-SHA256 of ``v0:{ts}:{body}`` under a
   configured signing secret, checked with ``slack_sdk``'s :class:`SignatureVerifier`.
   Unsigned, stale or badly signed: 401 (:class:`SlackRefused`), a warning in the app log
   only (no tenant is known, and an anonymous sender must not write to any chain).
2. **Tenant**: the workspace (``team.id``) of the payload must be the one configured for a
   tenant whose secret verified it; otherwise 403 ``slack_unknown_team``, logged in the
   ``_system`` chain (the sender held a signing secret: it is Slack, or has its secret).
3. **Person**: the Slack user's link in *that* tenant (:mod:`cosigner.slack.links`);
   unlinked, they get a one-time link URL; a disabled principal is refused.
4. **Review**: :func:`cosigner.approvals.reviews.review`, the function of the API and the
   pages, with a :class:`Caller` for the linked principal (``authn`` ``slack``): every
   separation-of-duties rule, tenant check and quorum applies and it logs its own events.
   A request whose requirement asks for step-up or a signature (``assurance``,
   ``min_acr``, ``max_auth_age_s``, ``signature``), or a review refused with
   ``step_up_required``/``signature_required``, sends the person to the web page.

Refusals before the review are ``slack.interaction_refused`` events in the tenant's chain.
Slack waits 3 s for the answer: the database work happens in the request, the Web API
calls (ephemeral answers, the modal) in :attr:`Answer.followups`, after the response.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from slack_sdk.signature import Clock as SlackClock
from slack_sdk.signature import SignatureVerifier

from cosigner.approvals.requests import load
from cosigner.approvals.reviews import review
from cosigner.audit.chain import Event, append
from cosigner.core.clock import Clock
from cosigner.core.errors import CosignerError, Forbidden, InvalidRequest
from cosigner.core.roles import SYSTEM_TENANT
from cosigner.slack import blocks, links
from cosigner.slack.api import SlackApi, SlackCallFailed
from cosigner.slack.links import SlackUser

if TYPE_CHECKING:
    from cosigner.context import AppContext

log = logging.getLogger("cosigner.slack")

#: Slack's replay window (s): a request timestamp further from now is refused.
MAX_SKEW_S = 300
#: Requirement keys that need a web session (step-up, signed reviews): not from Slack.
WEB_ONLY_KEYS = ("assurance", "min_acr", "max_auth_age_s", "signature")
WEB_ONLY_CODES = frozenset({"step_up_required", "signature_required"})

REFUSALS: dict[str, str] = {
    "self_approval": "You cannot review a request you initiated or that is on your behalf.",
    "not_eligible": "You do not hold a role this request needs.",
    "previous_approver": "You already approved an earlier call of this run; someone else "
                         "must approve this one.",
    "duplicate_review": "You have already reviewed this request.",
    "role_already_met": "The roles you could count for are already met.",
    "approval_expired": "This request has expired.",
    "approval_not_pending": "This request is already decided.",
    "not_found": "No such approval request in this workspace's Cosigner tenant.",
    "comment_required": "A reason is required to reject.",
    "comment_too_long": "The reason is too long (2000 characters at most).",
    "principal_disabled": "Your Cosigner account is disabled.",
}

FollowUp = Callable[[], Awaitable[None]]


class SlackRefused(Exception):
    """An interactivity request refused before its payload was read (``code``:
    ``slack_unsigned``, ``slack_stale``, ``slack_bad_signature``, ``slack_bad_payload``,
    ``slack_unknown_team``); ``status`` is the HTTP answer."""

    def __init__(self, code: str, detail: str, *, status: int = 401) -> None:
        super().__init__(detail)
        self.code, self.detail, self.status = code, detail, status


@dataclass
class Answer:
    """What to answer Slack now (``body``: JSON, or empty), what to call after, and
    whether a review was recorded (``changed``)."""

    body: dict[str, Any] | None = None
    followups: list[FollowUp] = field(default_factory=list)
    changed: bool = False


class _Clock(SlackClock):
    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def now(self) -> float:
        return self._clock().timestamp()


def verified_tenants(deps: AppContext, body: bytes, headers: Mapping[str, str]) -> list[str]:
    """Tenants whose signing secret signed ``body`` (step 1).

    Raises:
        SlackRefused: ``slack_unsigned`` (a header missing), ``slack_stale`` (timestamp
            not an integer within :data:`MAX_SKEW_S` of now), ``slack_bad_signature``.
    """
    timestamp = headers.get("x-slack-request-timestamp")
    signature = headers.get("x-slack-signature")
    if not timestamp or not signature:
        raise SlackRefused("slack_unsigned", "the request is not signed by Slack")
    now = deps.clock().timestamp()
    if not timestamp.isdigit() or abs(now - int(timestamp)) > MAX_SKEW_S:
        raise SlackRefused("slack_stale", "the request timestamp is not within 5 minutes")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        raise SlackRefused("slack_bad_signature", "the request signature does not match"
                           ) from None
    clock = _Clock(deps.clock)
    tenants = [tenant for tenant, workspace in sorted(deps.settings.slack.items())
               if SignatureVerifier(workspace.signing_secret.get_secret_value(), clock)
               .is_valid(body, timestamp, signature)]
    if not tenants:
        raise SlackRefused("slack_bad_signature", "the request signature does not match")
    return tenants


async def handle(deps: AppContext, body: bytes, headers: Mapping[str, str]) -> Answer:
    """Verify, then act on one interactivity request (``payload=`` form field).

    :attr:`Answer.changed` says a review was recorded (the message sync may run sooner).

    Raises:
        SlackRefused: steps 1 and 2 of the module docstring.
    """
    tenants = verified_tenants(deps, body, headers)
    try:
        payload = json.loads(parse_qs(body.decode("utf-8"))["payload"][0])
        team = str((payload.get("team") or {}).get("id") or payload["user"]["team_id"])
        user = SlackUser(team, str(payload["user"]["id"]),
                         str(payload["user"].get("username") or payload["user"].get("name")
                             or ""))
        kind = str(payload["type"])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise SlackRefused("slack_bad_payload", "the payload is not a Slack interaction",
                           status=400) from None
    tenant = next((t for t in tenants if deps.settings.slack[t].team_id == team), None)
    if tenant is None:
        await _record(deps, SYSTEM_TENANT, user, "slack_unknown_team", action=kind)
        raise SlackRefused("slack_unknown_team", "this Slack workspace serves no tenant",
                           status=403)
    api = SlackApi.for_tenant(deps.settings, tenant)
    assert api is not None
    if kind == "block_actions":
        return await _clicked(deps, api, tenant, user, payload)
    if kind == "view_submission" and (payload.get("view") or {}).get("callback_id") == \
            blocks.REJECT:
        return await _reject_submitted(deps, api, tenant, user, payload)
    return Answer()  # other interactions (link buttons, modal closed): nothing to do


async def _clicked(deps: AppContext, api: SlackApi, tenant: str, user: SlackUser,
                   payload: dict[str, Any]) -> Answer:
    action = (payload.get("actions") or [{}])[0]
    action_id, approval_id = str(action.get("action_id")), str(action.get("value") or "")
    channel = str((payload.get("channel") or {}).get("id") or "")
    if action_id not in (blocks.APPROVE, blocks.REJECT):
        return Answer()  # "Open in Cosigner" is a link; Slack still reports the click
    say = _say(api, channel, user)
    caller = await _linked(deps, tenant, user, action_id, approval_id, say)
    if isinstance(caller, Answer):
        return caller
    web = await _web_only(deps, tenant, user, approval_id, action_id, say)
    if web is not None:
        return web
    if action_id == blocks.REJECT:
        tool = await _tool(deps, tenant, approval_id)
        modal = blocks.reject_modal(approval_id, tool, channel=channel or None)
        return Answer(followups=[_guarded(lambda: api.open_view(
            str(payload.get("trigger_id") or ""), modal))])
    try:
        state = await review(deps, caller, approval_id, decision="approved", comment="")
    except CosignerError as exc:
        await _invalid_logged(deps, tenant, caller, exc, approval_id, action_id)
        return Answer(followups=[say(_refusal_text(deps, exc, approval_id))])
    return Answer(followups=[say(_approved_text(state))], changed=True)


async def _reject_submitted(deps: AppContext, api: SlackApi, tenant: str, user: SlackUser,
                            payload: dict[str, Any]) -> Answer:
    view = payload["view"]
    try:
        meta = json.loads(view.get("private_metadata") or "{}")
        approval_id, channel = str(meta["approval_id"]), str(meta.get("channel") or "")
    except (ValueError, KeyError, TypeError):
        return _modal_error("This form is not valid any more; click Reject again.")
    say = _say(api, channel, user)
    caller = await _linked(deps, tenant, user, "view_submission", approval_id, say)
    if isinstance(caller, Answer):
        return _modal_error("Link your Slack account to Cosigner first (see the message "
                            "from Cosigner).", followups=caller.followups)
    web = await _web_only(deps, tenant, user, approval_id, "view_submission", say)
    if web is not None:
        return _modal_error("This request must be reviewed in the web page (see the "
                            "message from Cosigner).", followups=web.followups)
    values = ((view.get("state") or {}).get("values") or {})
    reason = str(((values.get(blocks.REASON_BLOCK) or {}).get(blocks.REASON_ACTION) or {})
                 .get("value") or "")
    try:
        await review(deps, caller, approval_id, decision="rejected", comment=reason.strip())
    except CosignerError as exc:
        await _invalid_logged(deps, tenant, caller, exc, approval_id, "view_submission")
        if exc.code in WEB_ONLY_CODES:
            return _modal_error(_refusal_text(deps, exc, approval_id, links=False),
                                followups=[say(_refusal_text(deps, exc, approval_id))])
        return _modal_error(_refusal_text(deps, exc, approval_id, links=False))
    return Answer(followups=[say("You rejected this request; the reason is recorded.")]
                  if channel else [], changed=True)


# --- steps --------------------------------------------------------------------------------


async def _linked(deps: AppContext, tenant: str, user: SlackUser, action: str,
                  approval_id: str, say: Callable[[str], FollowUp]) -> Any:
    """The linked :class:`Caller`, or the :class:`Answer` for an unlinked or disabled one."""
    try:
        caller = await links.caller_for(deps.db, tenant, user)
    except Forbidden as exc:
        await _record(deps, tenant, user, exc.code, action=action, approval_id=approval_id)
        return Answer(followups=[say(REFUSALS["principal_disabled"])])
    if caller is not None:
        return caller
    token = await links.issue_token(deps.db, tenant=tenant, user=user, now=deps.clock(),
                                    ttl_s=deps.settings.slack_link_ttl_s)
    await _record(deps, tenant, user, "slack_not_linked", action=action,
                  approval_id=approval_id)
    url = links.link_url(deps.settings.public_url, token)
    minutes = deps.settings.slack_link_ttl_s // 60
    return Answer(followups=[say(
        f"Your Slack account is not linked to Cosigner yet. Open <{url}|this link> while "
        f"signed in to Cosigner and confirm (valid {minutes} min, once); then click again.")])


async def _web_only(deps: AppContext, tenant: str, user: SlackUser, approval_id: str,
                    action: str, say: Callable[[str], FollowUp]) -> Answer | None:
    """An :class:`Answer` sending the person to the web page when the request's current
    requirement asks for step-up or a signature; ``None`` otherwise."""
    async with deps.db.read() as conn:
        row = await load(conn, tenant, approval_id, lock=False)
    if row is None or not any(key in row.requirement for key in WEB_ONLY_KEYS):
        return None  # an unknown id is refused (and logged) by the review itself
    await _record(deps, tenant, user, "step_up_required", action=action,
                  approval_id=approval_id)
    return Answer(followups=[say(
        "This request needs a stronger sign-in or a signed review: review it in "
        f"<{_page(deps, approval_id)}|the Cosigner web page>.")])


async def _tool(deps: AppContext, tenant: str, approval_id: str) -> str:
    async with deps.db.read() as conn:
        row = await load(conn, tenant, approval_id, lock=False)
    return str(row.tool) if row is not None else "?"


async def _invalid_logged(deps: AppContext, tenant: str, caller: Any, exc: CosignerError,
                          approval_id: str, action: str) -> None:
    """Record refusals the review raises before writing its own event (a missing or too
    long reason); the review function logs every other refusal itself."""
    if isinstance(exc, InvalidRequest):
        await _record(deps, tenant, None, exc.code, action=action, approval_id=approval_id,
                      actor=caller.actor())


async def _record(deps: AppContext, tenant: str, user: SlackUser | None, code: str, *,
                  action: str, approval_id: str | None = None,
                  actor: dict[str, Any] | None = None) -> None:
    payload: dict[str, Any] = {"code": code, "action": action, "channel": "slack"}
    if user is not None:
        payload.update(team_id=user.team_id, user_id=user.user_id)
    event = Event(type="slack.interaction_refused",
                  actor=actor or (user.actor() if user else {}),
                  approval_id=approval_id or None, payload=payload)
    async with deps.db.transaction() as conn:
        await append(conn, tenant, [event], now=deps.clock())


# --- answers ------------------------------------------------------------------------------


def _page(deps: AppContext, approval_id: str) -> str:
    return f"{deps.settings.public_url.rstrip('/')}/ui/approvals/{approval_id}"


def _refusal_text(deps: AppContext, exc: CosignerError, approval_id: str, *,
                  links: bool = True) -> str:
    if exc.code in WEB_ONLY_CODES:
        where = f"<{_page(deps, approval_id)}|the Cosigner web page>" if links \
            else "the Cosigner web page"
        return f"This request needs a stronger sign-in or a signed review: review it in {where}."
    text = REFUSALS.get(exc.code, exc.detail)
    return f"Not recorded: {text} ({exc.code})"


def _approved_text(state: dict[str, Any]) -> str:
    if state.get("status") == "approved":
        return "You approved this request. Every role is met: the permit is minted."
    groups = ", ".join(f"{g['role']} {g['approved']}/{g['count']}"
                       for g in state.get("progress") or [])
    return f"Your approval counts. Still needed: {groups}."


def _modal_error(text: str, *, followups: list[FollowUp] | None = None) -> Answer:
    return Answer(body={"response_action": "errors", "errors": {blocks.REASON_BLOCK: text}},
                  followups=followups or [])


def _say(api: SlackApi, channel: str, user: SlackUser) -> Callable[[str], FollowUp]:
    """``say(text)``: a follow-up posting ``text`` to the user alone in ``channel``."""
    def say(text: str) -> FollowUp:
        return _guarded(lambda: api.post_ephemeral(channel, user.user_id, text))
    return say


def _guarded(call: Callable[[], Awaitable[None]]) -> FollowUp:
    async def run() -> None:
        try:
            await call()
        except SlackCallFailed as exc:  # best effort: the click itself is recorded
            log.warning("slack follow-up call failed: %s", exc.error)
    return run
