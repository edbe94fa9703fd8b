"""What an approval request looks like to callers: state object, progress, masked args.

Pure functions over stored rows. Arguments are stored canonical and already masked (so masked
values are not in the database either); every display still goes through
:func:`display_args`, which replaces the policy's ``mask`` paths (RFC 6901 JSON pointers) and
always-secret keys by :data:`MASK`, so masked values never appear in clear (invariant 10).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from cosigner.audit.masking import MASK, mask_value
from cosigner.core.clock import isoformat

__all__ = ["DEAD_PERMIT", "MASK", "display_args", "effective_status", "permit_status",
           "progress_of", "view"]
#: Seconds a client should wait before polling a pending request again.
RETRY_AFTER_S = 2
#: Requirement keys of a stage's step-up, shown as ``step_up``.
STEP_UP_KEYS = ("assurance", "min_acr", "max_auth_age_s")


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def display_args(args_json: str, mask: list[str] | tuple[str, ...]) -> Any:
    """The stored arguments with every ``mask`` pointer's value, and every always-secret
    key (:mod:`cosigner.audit.masking`, as in the decision log), replaced by ``"•••"``.

    A pointer that names nothing is ignored; ``""`` masks the whole document.
    """
    return mask_value(json.loads(args_json), list(mask))


def effective_status(row: Any, now: datetime) -> str:
    """The stored status, or ``expired`` once ``now >= expires_at`` (expiry wins)."""
    if row.status == "pending" and now >= _aware(row.expires_at):
        return "expired"
    return str(row.status)


def _stage(item: Any) -> int:
    return int(getattr(item, "stage", None) or 1)


def progress_of(row: Any, review_rows: list[Any]) -> list[dict[str, Any]]:
    """Per group ``{role, count, approved}`` from the roles the accepted reviews of the
    current stage count for (earlier stages' reviews never count again)."""
    counted = [r.role for r in review_rows
               if r.decision == "approved" and r.role and _stage(r) == _stage(row)]
    return [{"role": g["role"], "count": g["count"],
             "approved": min(counted.count(g["role"]), g["count"])}
            for g in row.requirement["require"]]


#: Permit states in which the token is not handed out any more: a revocation withdrew it
#: (a redeemed or expired one is still shown, next to its ``permit_status``).
DEAD_PERMIT = frozenset({"revoked"})


def permit_status(permit_row: Any, now: datetime) -> str | None:
    """The permit's state ``issued | redeemed | revoked | expired`` (an issued permit at
    ``now >= expires_at`` reads ``expired``, RFC 7519 §4.1.4), or ``None`` without one."""
    if permit_row is None:
        return None
    if permit_row.status == "issued" and now >= _aware(permit_row.expires_at):
        return "expired"
    return str(permit_row.status)


def view(row: Any, review_rows: list[Any], *, public_url: str, now: datetime,
         brief: bool = False, include_permit: bool = False,
         permit_row: Any = None) -> dict[str, Any]:
    """The approval object.

    ``brief``: the Decision's ``approval`` member ``{id, status, require, progress,
    distinct_from, expires_at, review_url}``. Otherwise the full state adds the call (masked
    args), reviews, ``retry_after`` (s, while pending), ``permit_status`` (the state of the
    permit minted on approval, from ``permit_row``, its ledger row) and, for runtime callers
    (``include_permit``), the permit once approved, unless it was revoked: the approval
    stays ``approved`` (terminal states never change), its revoked permit is not handed out
    as if usable. A superseded request (``cancelled``) names its replacement in
    ``superseded_by``.
    """
    status = effective_status(row, now)
    state: dict[str, Any] = {
        "id": row.id,
        "status": status,
        "require": row.requirement["require"],
        "progress": progress_of(row, review_rows),
        "distinct_from": row.requirement["distinct_from"],
        "expires_at": isoformat(_aware(row.expires_at)),
        "review_url": f"{public_url.rstrip('/')}/ui/approvals/{row.id}",
    }
    if brief:
        return state
    nxt = row.requirement.get("on_expired")
    state.update({
        "stage": _stage(row),
        # What the request escalates to when this stage times out (null: it expires).
        "on_expired": None if nxt is None else {
            "require": nxt["require"], "timeout_ms": nxt["timeout_ms"],
            "distinct_from": nxt["distinct_from"]},
        # The current stage's step-up (cosigner.approvals.stepup), or null.
        "step_up": {key: row.requirement[key] for key in STEP_UP_KEYS
                    if row.requirement.get(key) is not None} or None,
        "kind": row.kind,
        "decision_id": row.decision_id,
        "run_id": row.run_id,
        "tool": row.tool,
        "args": display_args(row.args, row.mask),
        "args_hash": row.args_hash,
        "masked_paths": list(row.mask),
        "initiator": row.initiator,
        "principal": row.principal,
        "reasons": row.reasons,
        "reason": row.reason,
        "policy": row.policy,
        "created_at": isoformat(_aware(row.created_at)),
        "decided_at": isoformat(_aware(row.decided_at)) if row.decided_at else None,
        # Superseded (cancelled for a request of the same call it could not join,
        # cosigner.approvals.superseding): the request that replaced it, or null.
        "superseded_by": getattr(row, "superseded_by", None),
        # A rejection stands (cosigner.approvals.rejections) until this is set.
        "rejection_withdrawn_at": (isoformat(_aware(withdrawn)) if (
            withdrawn := getattr(row, "withdrawn_at", None)) else None),
        "reviews": [{"subject": r.subject, "decision": r.decision, "role": r.role,
                     "stage": _stage(r), "comment": r.comment,
                     "at": isoformat(_aware(r.created_at)),
                     # Signed with the reviewer's passkey (cosigner.approvals.signatures).
                     "signed": getattr(r, "signature", None) is not None}
                    for r in review_rows],
        # Break-glass (cosigner.approvals.breakglass) and its after-the-fact review.
        "break_glass": getattr(row, "break_glass", None),
        "after_review": getattr(row, "after_review", None),
        "after_reviewed": getattr(row, "after_reviewed", None),
        "retry_after": RETRY_AFTER_S if status == "pending" else None,
        "permit_status": permit_status(permit_row, now),
        "permit": (row.permit if include_permit and status == "approved"
                   and permit_status(permit_row, now) not in DEAD_PERMIT else None),
    })
    return state
