"""Rejections stick: a call a person rejected stays denied in its run until withdrawn.

A call is (tenant, run, tool, args hash). Once an approval request about it is rejected (a
policy approval or a runtime-requested review), every later decision of that call in that
run is ``deny`` with reason ``rejected_by_reviewer`` (the message names the rejected
request's id and quotes the rejection's comment). It is checked after policy and wins over
it: the policy cannot turn the call back into ``allow``, and no new approval request is
opened for it. Cosigner has no "end of run" (a run is an id the runtime chooses; a
contract's deadline denies everything after it anyway), so a rejection stands for the
(tenant, run) until an approver withdraws it with :func:`withdraw`.

The state lives in the ``approvals`` rows themselves (``status = 'rejected'`` and
``withdrawn_at IS NULL``), read through the partial index ``ix_approvals_rejected_call``,
which holds only standing rejections, so every replica sees the same thing:

* a decision that reads state under the write lock anyway (approval, run contract) looks
  its call up there (:func:`standing`, one indexed query);
* a prepared ``allow`` (the hot path, nothing read per decision) is confirmed by its
  group-commit batch: one query for the whole batch (:func:`rejected_calls`); a hit
  refuses the item with :class:`RejectionFound` and the decision is taken again on the
  locked path, where :func:`standing` turns it into the deny.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, bindparam, func, literal_column, select
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.approvals.requests import event, load, reviews_of
from cosigner.approvals.views import view
from cosigner.audit.chain import Event, append
from cosigner.core.errors import (
    ApprovalStateError,
    CosignerError,
    InvalidRequest,
    NotFound,
    ReviewRefused,
    Unavailable,
)
from cosigner.core.subjects import subject_key
from cosigner.db.raw_insert import raw_sqlite
from cosigner.db.raw_sql import RawStatement
from cosigner.db.tables_approvals import approvals, reviews
from cosigner.identity.principals import Caller
from cosigner.policy import quorum
from cosigner.policy.result import Reason, parse_requirement

if TYPE_CHECKING:
    from cosigner.context import AppContext

__all__ = ["REASON_CODE", "Call", "RejectionFound", "rejected_calls", "standing",
           "standing_raw", "withdraw"]

REASON_CODE = "rejected_by_reviewer"
MAX_REASON_CHARS = 500
#: ``(tenant, run_id, tool, args_hash)``
Call = tuple[str, str, str, str]

#: The predicate of the partial index ``ix_approvals_rejected_call``, with the status as a
#: literal in the SQL. With ``status = ?`` SQLite re-prepares the statement at every
#: execution to learn from the bound value whether the partial index applies (~30 µs of a
#: ~6 µs lookup), and a generic PostgreSQL plan of the prepared statement cannot use it.
_STANDING = and_(approvals.c.status == literal_column("'rejected'"),
                 approvals.c.withdrawn_at.is_(None))


class RejectionFound(Unavailable):
    """A prepared ``allow`` met a standing rejection of its call inside the write
    transaction: nothing was written; decide again on the locked path. Internal to
    :func:`cosigner.decisions.pdp.decide` (were it ever to escape, it answers 503: deny)."""


def reason(approval_id: str, comment: str) -> Reason:
    """The ``rejected_by_reviewer`` reason of a decision denied by a standing rejection."""
    return Reason(REASON_CODE, f"approval {approval_id} was rejected by a reviewer: "
                               f"{comment[:MAX_REASON_CHARS]}")


async def standing(conn: AsyncConnection, *, tenant: str, run_id: str, tool: str,
                   args_hash: str) -> Reason | None:
    """The reason denying this call when a rejection of it stands in its run, else None."""
    values = {"tenant": tenant, "run_id": run_id, "tool": tool, "args_hash": args_hash}
    raw = await raw_sqlite(conn)
    if raw is not None:  # the batch's own sqlite3 connection: no Core round trip
        rows = _STANDING_CALL_RAW.run(raw, conn.dialect, values)[0]
        return None if not rows else reason(rows[0][0], rows[0][1] or "")
    row = (await conn.execute(_STANDING_CALL, values)).first()
    return None if row is None else reason(row.id, row.comment or "")


def standing_raw(raw: sqlite3.Connection, dialect: Dialect, *, tenant: str, run_id: str,
                 tool: str, args_hash: str) -> Reason | None:
    """:func:`standing` on a raw batch transaction's ``sqlite3`` connection."""
    rows = _STANDING_CALL_RAW.run(raw, dialect, {"tenant": tenant, "run_id": run_id,
                                                 "tool": tool, "args_hash": args_hash})[0]
    return None if not rows else reason(rows[0][0], rows[0][1] or "")


# Built once (binds by name): the decision batch runs it for every call it must check.
_STANDING_CALL = (
    select(approvals.c.id, reviews.c.comment)
    .outerjoin(reviews, and_(reviews.c.approval_id == approvals.c.id,
                             reviews.c.decision == "rejected"))
    .where(approvals.c.tenant == bindparam("tenant"),
           approvals.c.run_id == bindparam("run_id"), approvals.c.tool == bindparam("tool"),
           approvals.c.args_hash == bindparam("args_hash"), _STANDING)
    # Ordered by an expression, not the column: SQLite otherwise walks the tenant's whole
    # ix_approvals_tenant_decided index for the LIMIT 1 (a cost growing with every request
    # the tenant ever opened) instead of seeking the tiny partial index of rejections.
    .order_by(func.coalesce(approvals.c.decided_at, approvals.c.decided_at).desc())
    .limit(1))
_STANDING_CALL_RAW = RawStatement(_STANDING_CALL)


async def rejected_calls(conn: AsyncConnection, calls: set[Call]) -> set[Call]:
    """Which of ``calls`` have a standing rejection, in one query (a group-commit batch
    holds at most ``log_batch_max`` ≤ 1,000 of them)."""
    if not calls:
        return set()
    rows = await conn.execute(
        select(approvals.c.tenant, approvals.c.run_id, approvals.c.tool,
               approvals.c.args_hash)
        .where(approvals.c.tenant.in_({call[0] for call in calls}),
               approvals.c.run_id.in_({call[1] for call in calls}), _STANDING))
    return {(r.tenant, r.run_id, r.tool, r.args_hash) for r in rows} & calls


def _refusal(caller: Caller, row: Any) -> CosignerError | None:
    """Who may withdraw: an admin of the tenant or an approver holding one of the
    request's required roles, and never the requesting side of the call (the runtime that
    opened it, its initiator or principal: the rule of a review, case K13)."""
    required = quorum.required_roles(parse_requirement(row.requirement))
    if not caller.has_any("admin") and not caller.roles & required:
        return ReviewRefused("only an admin or an approver holding a required role may "
                             "withdraw a rejection", code="not_eligible")
    me = subject_key(caller.subject)
    requesting = {subject_key(str(row.opened_by.get("subject"))),
                  subject_key(str(row.initiator.get("id"))),
                  subject_key(str(row.principal.get("id")))}
    if me in requesting:
        return ReviewRefused("the requester, initiator or principal cannot withdraw this "
                             "rejection", code="self_approval")
    if row.status != "rejected":
        return ApprovalStateError(f"the approval request is {row.status}, not rejected",
                                  code="not_rejected")
    if row.withdrawn_at is not None:
        return ApprovalStateError("the rejection was already withdrawn",
                                  code="rejection_withdrawn")
    return None


async def withdraw(deps: AppContext, caller: Caller, approval_id: str, *,
                   reason_text: str) -> dict[str, Any]:
    """Withdraw a standing rejection: the call may be decided afresh in its run (a new
    decision evaluates the policy again; nothing is approved by the withdrawal).

    Logged as ``approval.rejection_withdrawn`` with the actor and ``reason_text``; a
    refused attempt as ``approval.withdraw_refused`` (committed before the error).

    Raises:
        InvalidRequest: ``reason_required`` (blank reason).
        NotFound: no such request in the caller's tenant.
        ReviewRefused: ``not_eligible`` (neither admin nor holder of a required role),
            ``self_approval`` (the requesting side of the call).
        ApprovalStateError: ``not_rejected``, ``rejection_withdrawn`` (already).
    """
    if not reason_text.strip():
        raise InvalidRequest("withdrawing a rejection needs a reason", code="reason_required")
    now: datetime = deps.clock()
    who = caller.actor()
    async with deps.db.transaction() as conn:
        row = await load(conn, caller.tenant, approval_id, lock=True)
        if row is None:
            refusal: CosignerError | None = NotFound("no such approval request")
            events = [Event(type="approval.withdraw_refused", actor=who,
                            payload={"code": "not_found"})]
        else:
            refusal = _refusal(caller, row)
            if refusal is not None:
                events = [event("approval.withdraw_refused", row, who, code=refusal.code)]
            else:
                await conn.execute(approvals.update().where(
                    approvals.c.id == row.id, approvals.c.withdrawn_at.is_(None))
                    .values(withdrawn_at=now, withdrawn_by=who))
                events = [event("approval.rejection_withdrawn", row, who,
                                reason=reason_text[:MAX_REASON_CHARS])]
        await append(conn, caller.tenant, events, now=now)
        state = {} if row is None else view(
            await load(conn, caller.tenant, approval_id, lock=False),
            await reviews_of(conn, approval_id), public_url=deps.settings.public_url,
            now=now)
    if refusal is not None:
        raise refusal
    return state
