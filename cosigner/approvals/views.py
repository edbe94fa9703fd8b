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

__all__ = ["MASK", "display_args", "effective_status", "progress_of", "view"]
#: Seconds a client should wait before polling a pending request again.
RETRY_AFTER_S = 2


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


def progress_of(row: Any, review_rows: list[Any]) -> list[dict[str, Any]]:
    """Per group ``{role, count, approved}`` from the roles the accepted reviews count for."""
    counted = [r.role for r in review_rows if r.decision == "approved" and r.role]
    return [{"role": g["role"], "count": g["count"],
             "approved": min(counted.count(g["role"]), g["count"])}
            for g in row.requirement["require"]]


def view(row: Any, review_rows: list[Any], *, public_url: str, now: datetime,
         brief: bool = False, include_permit: bool = False) -> dict[str, Any]:
    """The approval object.

    ``brief``: the Decision's ``approval`` member ``{id, status, require, progress,
    distinct_from, expires_at, review_url}``. Otherwise the full state adds the call (masked
    args), reviews, ``retry_after`` (s, while pending) and, for runtime callers
    (``include_permit``), the permit once approved.
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
    state.update({
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
        # A rejection stands (cosigner.approvals.rejections) until this is set.
        "rejection_withdrawn_at": (isoformat(_aware(withdrawn)) if (
            withdrawn := getattr(row, "withdrawn_at", None)) else None),
        "reviews": [{"subject": r.subject, "decision": r.decision, "role": r.role,
                     "comment": r.comment, "at": isoformat(_aware(r.created_at))}
                    for r in review_rows],
        "retry_after": RETRY_AFTER_S if status == "pending" else None,
        "permit": row.permit if include_permit and status == "approved" else None,
    })
    return state
