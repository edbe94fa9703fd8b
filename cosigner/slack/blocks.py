"""What Cosigner posts to Slack: Block Kit for an approval request, the reject modal, and
the short texts of ephemeral answers. Pure functions over the approval state
(:func:`cosigner.approvals.views.view`), whose arguments are already masked (``•••``,
invariant 10).

Everything shown that a model or a person wrote (tool arguments, reasons, comments, names)
goes through :func:`escape`: Slack's ``mrkdwn`` reads ``<...>`` as links and mentions
(``<!channel>``), so ``&``, ``<`` and ``>`` are escaped as Slack documents
(https://docs.slack.dev/messaging/formatting-message-text#escaping).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from cosigner.core.canonical import canonicalize

#: ``action_id`` of the buttons and ``callback_id`` of the reject modal.
APPROVE = "cosigner_approve"
REJECT = "cosigner_reject"
REASON_BLOCK = "reason"
REASON_ACTION = "reason"
#: At most this many arguments in the summary, each value cut to this many characters.
MAX_ARGS = 12
MAX_VALUE_CHARS = 200

_OUTCOME = {"approved": ("white_check_mark", "Approved"),
            "rejected": ("x", "Rejected"),
            "expired": ("hourglass", "Expired"),
            "cancelled": ("no_entry_sign", "Cancelled")}


def escape(text: str) -> str:
    """``text`` safe inside ``mrkdwn``: ``&``, ``<``, ``>`` as entities (no links,
    no mentions)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _plain(text: str, limit: int = 150) -> dict[str, Any]:
    return {"type": "plain_text", "text": text[:limit] or " ", "emoji": False}


def _md(text: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": text[:3000]}


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else canonicalize(value).decode()
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 1] + "…"


def args_summary(args: Any) -> str:
    """The masked arguments as ``mrkdwn`` lines ``• name: value`` (objects and arrays in
    RFC 8785 form, long values cut), or the canonical text when they are not an object."""
    if not isinstance(args, dict):
        return escape(_value(args))
    lines = [f"• `{escape(str(key))}`: {escape(_value(args[key]))}"
             for key in sorted(args)[:MAX_ARGS]]
    if len(args) > MAX_ARGS:
        lines.append(f"… and {len(args) - MAX_ARGS} more (see the web page)")
    return "\n".join(lines) or "(no arguments)"


def _party(value: Any) -> str:
    if isinstance(value, dict):
        kind = value.get("type")
        ident = str(value.get("id", "?"))
        return escape(f"{ident} ({kind})" if kind else ident)
    return escape(str(value))


def _when(text: str) -> str:
    """A Slack date token (shown in each reader's own time zone), UTC text as fallback."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    fallback = moment.strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{int(moment.timestamp())}^{{date_short_pretty}} {{time}}|{fallback}>"


def time_left(expires_at: str, now: datetime) -> str:
    """``"25 min left"``-style text at ``now`` (``"expired"`` at or after expiry)."""
    seconds = int((datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
                   - now).total_seconds())
    if seconds <= 0:
        return "expired"
    if seconds < 3600:
        return f"{max(1, seconds // 60)} min left"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min left"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h left"


def _requirement(state: dict[str, Any]) -> str:
    groups = [f"{escape(str(g['role']))} {g['approved']}/{g['count']}"
              for g in state["progress"]]
    return ", ".join(groups)


def message(state: dict[str, Any], *, now: datetime) -> tuple[str, list[dict[str, Any]]]:
    """``(fallback text, blocks)`` of the channel message for one request.

    Pending: tool, requester, arguments summary, reasons, time left, progress, a link to
    the web page and Approve/Reject buttons. Decided, expired or cancelled: the same facts
    with the outcome (who decided, a rejection's comment) and no buttons.
    """
    tool = escape(str(state["tool"]))
    status = state["status"]
    url = state["review_url"]
    reasons = "\n".join(
        f"• `{escape(str(r.get('code', '')))}` {escape(str(r.get('message', '')))}".rstrip()
        for r in state.get("reasons") or [] if isinstance(r, dict)) or "(none)"
    if status == "pending":
        title = f"Approval needed: {state['tool']}"
        text = f"Approval needed: {tool}"
    else:
        emoji, word = _OUTCOME.get(status, ("grey_question", status.capitalize()))
        title = f"{word}: {state['tool']}"
        text = f":{emoji}: {word}: {tool}"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": _plain(title)},
        {"type": "section", "fields": [
            _md(f"*Tool*\n`{tool}`"),
            _md(f"*Run*\n`{escape(str(state['run_id']))}`"),
            _md(f"*Initiator*\n{_party(state['initiator'])}"),
            _md(f"*On behalf of*\n{_party(state['principal'])}"),
        ]},
        {"type": "section", "text": _md(f"*Arguments*\n{args_summary(state['args'])}")},
        {"type": "section", "text": _md(f"*Reasons*\n{reasons}")},
    ]
    if status == "pending":
        blocks.append({"type": "section", "text": _md(
            f"*Time left* {time_left(state['expires_at'], now)} (expires "
            f"{_when(state['expires_at'])})\n*Needs* {_requirement(state)}"
            + (f" (stage {state['stage']})" if state.get("stage", 1) > 1 else ""))})
        blocks.append({"type": "actions", "block_id": "cosigner_review", "elements": [
            {"type": "button", "action_id": APPROVE, "style": "primary",
             "text": _plain("Approve"), "value": state["id"],
             "confirm": {"title": _plain("Approve this call?"),
                         "text": _md(f"Approve `{tool}` with the arguments shown? "
                                     "A permit is minted when every role is met."),
                         "confirm": _plain("Approve"), "deny": _plain("Cancel")}},
            {"type": "button", "action_id": REJECT, "style": "danger",
             "text": _plain("Reject"), "value": state["id"]},
            {"type": "button", "action_id": "cosigner_open", "text": _plain("Open in Cosigner"),
             "url": url},
        ]})
    else:
        blocks.append({"type": "section", "text": _md(_outcome(state))})
    blocks.append({"type": "context", "elements": [_md(
        f"args hash `{state['args_hash']}` · <{url}|open in Cosigner>")]})
    return text, blocks


def _outcome(state: dict[str, Any]) -> str:
    status = state["status"]
    emoji, word = _OUTCOME.get(status, ("grey_question", status.capitalize()))
    line = f":{emoji}: *{word}*"
    if state.get("decided_at"):
        line += f" {_when(state['decided_at'])}"
    deciders = [r for r in state.get("reviews") or [] if r["decision"] == status]
    if status in ("approved", "rejected") and deciders:
        line += " by " + ", ".join(escape(r["subject"]) for r in deciders)
    for r in deciders:
        if status == "rejected" and r.get("comment"):
            line += f"\n>{escape(r['comment'][:500])}"
    return line


def reject_modal(approval_id: str, tool: str, *, channel: str | None) -> dict[str, Any]:
    """The modal the Reject button opens (``views.open``): a required reason.

    ``private_metadata`` carries the request id and the channel for the answer; Slack
    stores it server-side and returns it in the signed ``view_submission``.
    """
    return {
        "type": "modal", "callback_id": REJECT,
        "private_metadata": json.dumps({"approval_id": approval_id, "channel": channel}),
        "title": _plain("Reject request", 24), "submit": _plain("Reject", 24),
        "close": _plain("Cancel", 24),
        "blocks": [
            {"type": "section", "text": _md(f"Reject `{escape(tool)}`? The reason is "
                                            "recorded in the decision log.")},
            {"type": "input", "block_id": REASON_BLOCK, "optional": False,
             "label": _plain("Reason"),
             "element": {"type": "plain_text_input", "action_id": REASON_ACTION,
                         "multiline": True, "min_length": 1, "max_length": 2000}},
        ],
    }
