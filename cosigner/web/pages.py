"""What the approver pages show, built from the approvals domain module.

Reads go through :mod:`cosigner.approvals.queries` (tenant-scoped); the one write goes
through :func:`cosigner.approvals.reviews.review`. Arguments are shown via
``approvals.display_args`` (masked paths as ``•••``) in their canonical form, next to the
money fields the tool catalogue's display hints name, formatted in the page's locale
(:mod:`cosigner.web.amounts`). The lists (inbox, history) are :mod:`cosigner.web.lists`.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cosigner.approvals import queries as approval_queries
from cosigner.approvals import reviews as approvals
from cosigner.approvals.signatures import REFUSALS as signature_refusals
from cosigner.context import AppContext
from cosigner.core.errors import CosignerError, Forbidden, InvalidRequest, NotFound, ReviewRefused
from cosigner.identity.principals import Caller
from cosigner.policy.display import DisplayHint
from cosigner.runs import timeline
from cosigner.web import amounts, views

#: Decisions of the run shown on the detail page (the latest ones).
RUN_PANEL = 20

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


#: Statuses shown with their permit's fate (the approval itself never changes, DESIGN).
_PERMIT_NOTES = {"revoked": "permit revoked"}


def status_text(status: str, permit_status: str | None) -> str:
    """``approved — permit revoked`` for an approval whose permit was revoked later;
    otherwise the status itself."""
    note = _PERMIT_NOTES.get(permit_status or "") if status == "approved" else None
    return f"{status} — {note}" if note else status


def locale_of(deps: AppContext, accept_language: str | None) -> str:
    """The page locale: ``Accept-Language`` when allowed and known, else ``ui_locale``."""
    settings = deps.settings
    if settings.ui_locale_from_browser and accept_language:
        return amounts.negotiate(accept_language, settings.ui_locale)
    return settings.ui_locale


def hints_for(deps: AppContext, tenant: str, policy: Any, tool: str
              ) -> Mapping[str, DisplayHint]:
    """Display hints of ``tool`` from the catalogue of the bundle that decided (the same
    version when it is still loaded, else that bundle's active version, else the tenant's
    bundle); empty without a catalogue entry."""
    snapshot = deps.store.snapshot
    bundle = None
    if isinstance(policy, dict) and policy.get("id"):
        bundle = (snapshot.bundles.get(str(policy["id"]), {}).get(str(policy.get("version")))
                  or snapshot.active_bundle(str(policy["id"])))
    bundle = bundle or snapshot.bundle_for(tenant)
    catalogue = getattr(bundle, "catalogue", None)
    spec = catalogue.lookup(tool) if catalogue is not None else None
    return spec.display if spec is not None else {}


def item(state: dict[str, Any], now: datetime, *, hints: Mapping[str, DisplayHint],
         locale: str) -> dict[str, Any]:
    """One request as a list row: summary (amounts formatted), parties, time, progress."""
    args = state["args"]
    expires = _parse(state["expires_at"])
    progress = state["progress"]
    return {
        "id": state["id"], "tool": state["tool"], "status": state["status"],
        "status_text": status_text(state["status"], state.get("permit_status")),
        "permit_status": state.get("permit_status"),
        "summary": views.summary(args, hints, locale),
        "initiator": views.party(state["initiator"]),
        "principal": views.party(state["principal"]),
        "time_left": views.time_left(expires, now),
        "seconds_left": views.seconds_left(expires, now),
        "expires_iso": state["expires_at"],
        "expires_at": views.utc_text(expires),
        "created_at": views.utc_text(_parse(state["created_at"])),
        "decided_at": views.utc_text(_parse(state["decided_at"]))
        if state.get("decided_at") else "",
        "progress_have": sum(g["approved"] for g in progress),
        "progress_need": sum(g["count"] for g in progress),
        "progress_text": ", ".join(f"{g['role']} {g['approved']}/{g['count']}"
                                   for g in progress),
        "reviews": state["reviews"],
    }


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def detail(deps: AppContext, caller: Caller, approval_id: str, *,
                 locale: str | None = None) -> dict[str, Any]:
    """Everything the detail page shows; the arguments as canonical text (masked ``•••``),
    every money field formatted, and the run panel (:func:`cosigner.runs.timeline`).

    Raises:
        NotFound: no such request in the caller's tenant. Forbidden: not the caller's to read.
    """
    state = await approval_queries.get_state(deps, caller, approval_id)
    now = deps.clock()
    locale = locale or deps.settings.ui_locale
    policy = state.get("policy") or {}
    hints = hints_for(deps, caller.tenant, policy, state["tool"])
    by_role: dict[str, list[str]] = {}
    for r in state["reviews"]:
        if r["decision"] == "approved" and r["role"]:
            by_role.setdefault(r["role"], []).append(r["subject"])
    run = await timeline.run_timeline(deps.db, tenant=caller.tenant, run_id=state["run_id"],
                                      now=now, limit=RUN_PANEL)
    return {
        **item(state, now, hints=hints, locale=locale),
        "money": [f for f in views.summary(state["args"], hints, locale, limit=len(hints))
                  if f["money"]] if hints else [],
        "args_pretty": views.pretty_canonical(state["args"]),
        "args_hash": state["args_hash"],
        "reasons": state.get("reasons") or [],
        "reason": state.get("reason"),
        "policy": f"{policy.get('id', '?')} {policy.get('version', '')}".strip()
        if policy else "none",
        "run_id": state["run_id"],
        "decision_id": state["decision_id"],
        "progress": [{"role": g["role"], "need": g["count"], "have": g["approved"],
                      "by": by_role.get(g["role"], [])} for g in state["progress"]],
        "permit_jti": _permit_jti(state),
        # Cancelled for a request of the same call it could not join: where it went.
        "superseded_by": state.get("superseded_by"),
        # The caller's approval must be signed with their passkey (passkeys.js asks for it).
        "signature": bool(caller.roles & {g["role"] for g in state["require"]
                                          if g.get("signature")}),
        "reviews": [{**r, "at": views.utc_text(_parse(r["at"]))} for r in state["reviews"]],
        "run": run_panel(deps, caller.tenant, run, locale=locale,
                         current=state["decision_id"]),
    }


def run_panel(deps: AppContext, tenant: str, run: dict[str, Any], *, locale: str,
              current: str) -> dict[str, Any]:
    """The run's decisions as rows: time, tool, summary, effect, approval, permit, outcome."""
    rows = []
    for entry in run["entries"]:
        hints = hints_for(deps, tenant, None, entry["tool"])
        approval = entry["approval"]
        rows.append({
            "current": entry["decision_id"] == current,
            "at": views.utc_text(_parse(entry["at"])),
            "tool": entry["tool"],
            "summary": views.summary(entry["args"], hints, locale, limit=3)
            if entry["args"] is not None else [],
            "effect": entry["effect"] + (" (shadow)" if entry["mode"] == "shadow" else ""),
            "reasons": entry["reasons"],
            "approval": None if approval is None else {
                "id": approval["id"],
                "status": status_text(approval["status"], entry["permit_status"])},
            "permit_status": entry["permit_status"],
            "outcome": entry["outcome"],
        })
    return {"rows": rows, "total": run["total"], "shown": len(rows)}


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
