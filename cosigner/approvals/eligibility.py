"""Who may read a request, and which pending requests a person may review now.

The same rules as :func:`cosigner.approvals.reviews.review` (through
:func:`cosigner.approvals.rules.refusal_code`), applied to lists: an approver's queue holds
only the requests they could approve at this moment (not expired, not their own, not
already reviewed by them, not a second approval in a run they approved in:
:func:`cosigner.approvals.rules.counts_as_previous`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.approvals import rules as review_rules
from cosigner.approvals.views import effective_status
from cosigner.db.tables_approvals import REVIEWED_REQUESTS, approvals, reviews
from cosigner.identity.principals import Caller
from cosigner.policy.result import parse_requirement

#: Roles that read every request of their tenant (they review none by that role alone).
READERS = ("runtime", "admin", "auditor", "breakglass")


def may_read(caller: Caller, row: Any) -> bool:
    """``caller`` (of the row's tenant) holds a reader role or a role the request needs."""
    needed = {g["role"] for g in row.requirement["require"]}
    return caller.has_any(*READERS) or bool(caller.roles & needed)


@dataclass(frozen=True, slots=True)
class Mark:
    """One of the caller's reviews: of which request, of which call (tool, args hash),
    an approval or not, voided by superseding or not."""

    approval_id: str
    call: tuple[str, str]
    approved: bool
    voided: bool


@dataclass
class Marks:
    """The caller's own reviews in the tenant, per run."""

    by_run: dict[str, list[Mark]] = field(default_factory=dict)


async def load_marks(conn: AsyncConnection, caller: Caller) -> Marks:
    """Read the caller's reviews of its tenant once, for :func:`reviewable_now`."""
    marks = Marks()
    mine = (await conn.execute(
        select(reviews.c.approval_id, reviews.c.run_id, reviews.c.decision, reviews.c.role,
               approvals.c.tool, approvals.c.args_hash)
        .select_from(REVIEWED_REQUESTS)
        .where(reviews.c.tenant == caller.tenant,
               reviews.c.subject == caller.subject))).all()
    for item in mine:
        approved = item.decision == "approved"
        marks.by_run.setdefault(item.run_id, []).append(Mark(
            approval_id=item.approval_id, call=(item.tool, item.args_hash),
            approved=approved, voided=approved and item.role is None))
    return marks


def reviewable_now(caller: Caller, row: Any, marks: Marks, now: datetime) -> bool:
    """``caller`` could approve pending request ``row`` at ``now`` (every review rule)."""
    if effective_status(row, now) != "pending":
        return False
    run_marks = marks.by_run.get(row.run_id, [])
    call = (row.tool, row.args_hash)
    ctx = review_rules.ReviewContext(
        requirement=parse_requirement(row.requirement),
        initiator_id=str(row.initiator.get("id")),
        principal_id=str(row.principal.get("id")),
        opened_by=str(row.opened_by.get("subject")),
        previous_approvers=frozenset(
            caller.subject for m in run_marks
            if m.approved and m.approval_id != row.id and review_rules.counts_as_previous(
                voided=m.voided, same_call=m.call == call)),
        reviewed=frozenset(caller.subject for m in run_marks if m.approval_id == row.id))
    return review_rules.refusal_code(ctx, subject=caller.subject, roles=caller.roles,
                                     decision="approved") is None


def in_queue(caller: Caller, row: Any, marks: Marks, now: datetime) -> bool:
    """A pending request shows in ``caller``'s queue: readers see all of them, approvers
    those they could approve now."""
    if not may_read(caller, row):
        return False
    return caller.has_any(*READERS) or reviewable_now(caller, row, marks, now)
