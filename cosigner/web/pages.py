"""What the approver pages show, built from the approvals domain module.

Reads go through :mod:`cosigner.approvals.reviews` helpers (tenant-scoped); the one write
goes through :func:`cosigner.approvals.reviews.review`. Arguments are shown via
``approvals.display_args`` (masked paths as ``•••``) in their canonical form.
"""

from __future__ import annotations

import hmac
from datetime import datetime
from typing import Any

from cosigner.approvals import queries as approval_queries
from cosigner.approvals import reviews as approvals
from cosigner.approvals.signatures import REFUSALS as signature_refusals
from cosigner.context import AppContext
from cosigner.core.errors import CosignerError, Forbidden, InvalidRequest, NotFound, ReviewRefused
from cosigner.identity.principals import Caller
from cosigner.web import views

#: Messages for refusals, by error code; anything else shows the domain error's text.
REFUSALS: dict[str, str] = {
    "self_approval": "You cannot approve a request you initiated or that is on your behalf.",
    "duplicate_review": "You have already reviewed this request.",
    "not_eligible": "You do not hold a role this request needs.",
    "previous_approver": "You already approved an earlier step of this run; someone else "
                         "must approve this one.",
    "approval_expired": "This request has expired and can no longer be approved.",
    "approval_not_pending": "This request is already decided.",
    "comment_required": "A comment is required to reject a request.",
    "args_changed": "The arguments differ from the ones you were shown. Reload the page.",
    "forbidden": "You are not allowed to review this request.",
}


def refusal_text(exc: CosignerError) -> str:
    """A clear sentence for a refused review."""
    return REFUSALS.get(exc.code) or signature_refusals.get(exc.code) or exc.detail


def status_for(exc: CosignerError) -> int:
    """HTTP status of a refused page action (same classes as the JSON API)."""
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Forbidden):
        return 403
    if isinstance(exc, InvalidRequest):
        return 422
    return 409


def _item(state: dict[str, Any], now: datetime) -> dict[str, Any]:
    args = state["args"]
    return {
        "id": state["id"], "tool": state["tool"], "status": state["status"],
        "highlights": views.highlights(args) if isinstance(args, dict) else [],
        "initiator": views.party(state["initiator"]),
        "principal": views.party(state["principal"]),
        "time_left": views.time_left(_parse(state["expires_at"]), now),
        "expires_at": state["expires_at"],
        "decided_at": views.utc_text(_parse(state["decided_at"]))
        if state.get("decided_at") else "",
        "reviews": state["reviews"],
    }


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def inbox_items(deps: AppContext, caller: Caller) -> list[dict[str, Any]]:
    """Pending requests ``caller`` may review now, soonest expiry first."""
    states = await approval_queries.list_requests(deps, caller, status="pending")
    now = deps.clock()
    return sorted((_item(s, now) for s in states), key=lambda i: i["expires_at"])


async def history_items(deps: AppContext, caller: Caller, *, limit: int = 100
                        ) -> list[dict[str, Any]]:
    """Decided requests the caller may read, most recently decided first."""
    now = deps.clock()
    items: list[dict[str, Any]] = []
    for status in ("approved", "rejected", "expired", "cancelled"):
        states = await approval_queries.list_requests(deps, caller, status=status, limit=limit)
        items += [{**_item(s, now), "sort": s.get("decided_at") or ""} for s in states]
    items.sort(key=lambda i: i["sort"], reverse=True)
    return items[:limit]


async def detail(deps: AppContext, caller: Caller, approval_id: str) -> dict[str, Any]:
    """Everything the detail page shows; the arguments as canonical text (masked ``•••``).

    Raises:
        NotFound: no such request in the caller's tenant. Forbidden: not the caller's to read.
    """
    state = await approval_queries.get_state(deps, caller, approval_id)
    now = deps.clock()
    policy = state.get("policy") or {}
    by_role: dict[str, list[str]] = {}
    for r in state["reviews"]:
        if r["decision"] == "approved" and r["role"]:
            by_role.setdefault(r["role"], []).append(r["subject"])
    return {
        **_item(state, now),
        "args_pretty": views.pretty_canonical(state["args"]),
        "args_hash": state["args_hash"],
        "reasons": state.get("reasons") or [],
        "reason": state.get("reason"),
        "policy": f"{policy.get('id', '?')} {policy.get('version', '')}".strip()
        if policy else "none",
        "run_id": state["run_id"],
        "progress": [{"role": g["role"], "need": g["count"], "have": g["approved"],
                      "by": by_role.get(g["role"], [])} for g in state["progress"]],
        "expires_at": views.utc_text(_parse(state["expires_at"])),
        "permit_jti": _permit_jti(state),
        # The caller's approval must be signed with their passkey (passkeys.js asks for it).
        "signature": bool(caller.roles & {g["role"] for g in state["require"]
                                          if g.get("signature")}),
        "reviews": [{**r, "at": views.utc_text(_parse(r["at"]))} for r in state["reviews"]],
    }


def _permit_jti(state: dict[str, Any]) -> str | None:
    permit = state.get("permit")
    return str(permit["jti"]) if isinstance(permit, dict) and "jti" in permit else None


async def review(deps: AppContext, caller: Caller, approval_id: str, *, decision: str, comment: str,
                 shown_args_hash: str, assertion: str | None = None) -> None:
    """Submit the form through :func:`cosigner.approvals.reviews.review` (every rule lives there).

    ``shown_args_hash`` is the hash printed on the page the approver submitted; it must be
    the request's, so a decision is never recorded for arguments other than those shown.

    Raises:
        ReviewRefused ``args_changed``; anything :func:`cosigner.approvals.reviews.review` raises.
    """
    state = await approval_queries.get_state(deps, caller, approval_id)
    if not hmac.compare_digest(shown_args_hash.encode(), str(state["args_hash"]).encode()):
        raise ReviewRefused("the page showed other arguments", code="args_changed")
    await approvals.review(deps, caller, approval_id, decision=decision, comment=comment,
                           assertion=assertion)
