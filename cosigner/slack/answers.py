"""What Cosigner answers a Slack click: the HTTP answer (a modal's errors), the texts only
the clicker sees (``chat.postEphemeral``), and the Web API calls made after the answer."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from cosigner.core.errors import CosignerError
from cosigner.slack import blocks
from cosigner.slack.api import SlackApi, SlackCallFailed

log = logging.getLogger("cosigner.slack")

#: Refusals that a web session can overcome (step-up sign-in, a signed review).
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


@dataclass
class Answer:
    """What to answer Slack now (``body``: JSON, or empty), what to call after, and
    whether a review was recorded (``changed``)."""

    body: dict[str, Any] | None = None
    followups: list[FollowUp] = field(default_factory=list)
    changed: bool = False


def page_url(public_url: str, approval_id: str) -> str:
    return f"{public_url.rstrip('/')}/ui/approvals/{approval_id}"


def web_only_text(url: str | None) -> str:
    where = f"<{url}|the Cosigner web page>" if url else "the Cosigner web page"
    return f"This request needs a stronger sign-in or a signed review: review it in {where}."


def refusal_text(exc: CosignerError, url: str | None) -> str:
    """The clicker's message for a refused review (``url``: the web page, as a link)."""
    if exc.code in WEB_ONLY_CODES:
        return web_only_text(url)
    return f"Not recorded: {REFUSALS.get(exc.code, exc.detail)} ({exc.code})"


def approved_text(state: dict[str, Any]) -> str:
    if state.get("status") == "approved":
        return "You approved this request. Every role is met: the permit is minted."
    groups = ", ".join(f"{g['role']} {g['approved']}/{g['count']}"
                       for g in state.get("progress") or [])
    return f"Your approval counts. Still needed: {groups}."


def signin_url(public_url: str, tenant: str, approval_id: str, *, sso: bool) -> str:
    """Where a person whose last sign-in is too old signs in again, then lands on the
    request: the tenant's single sign-on when it has one, else the sign-in page."""
    next_path = f"/ui/approvals/{approval_id}" if approval_id else "/ui"
    path = "/ui/oidc/start" if sso else "/ui/login"
    return f"{public_url.rstrip('/')}{path}?" + urlencode({"tenant": tenant,
                                                          "next": next_path})


def signin_stale_text(url: str) -> str:
    return ("Not recorded: you have not signed in to Cosigner recently, so your roles "
            f"cannot be confirmed. <{url}|Sign in to Cosigner>, then click again. "
            "(slack_signin_stale)")


def link_text(url: str, left_s: int) -> str:
    """The link message; ``left_s``: how long the link is still valid (s)."""
    return (f"Your Slack account is not linked to Cosigner yet. Open <{url}|this link> while "
            f"signed in to Cosigner and confirm (valid {max(left_s // 60, 1)} min, once); "
            "then click again.")


def modal_error(text: str, *, followups: list[FollowUp] | None = None) -> Answer:
    """Keep the reject modal open with ``text`` under the reason field."""
    return Answer(body={"response_action": "errors", "errors": {blocks.REASON_BLOCK: text}},
                  followups=followups or [])


def ephemeral(api: SlackApi, channel: str, user_id: str) -> Callable[[str], FollowUp]:
    """``say(text)``: a follow-up posting ``text`` to ``user_id`` alone in ``channel``."""
    def say(text: str) -> FollowUp:
        return guarded(lambda: api.post_ephemeral(channel, user_id, text))
    return say


def guarded(call: Callable[[], Awaitable[None]]) -> FollowUp:
    """``call`` as a follow-up: best effort, a failure is logged (the click itself is
    already recorded)."""
    async def run() -> None:
        try:
            await call()
        except SlackCallFailed as exc:
            log.warning("slack follow-up call failed: %s", exc.error)
    return run
