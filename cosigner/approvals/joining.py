"""Joining a pending approval request on a raw batch transaction's ``sqlite3`` connection.

A ``require_approval`` decision whose call (same tenant, run, tool, args hash) already has a
pending request joins it (:func:`cosigner.approvals.opening.open_request`): no new row, an
``approval.joined`` event, and the request's brief state as the Decision's ``approval``.
:func:`join_raw` is that join on the driver, in the group commit's raw transaction (issue
20, session 13: through SQLAlchemy a join cost about twice a new request). It reads the
twin and its reviews with the statements SQLAlchemy would send (:class:`RawStatement`:
same SQL, same bind and result processors), so the event (hence the chain) and the answer
are the same either way. Its one case is a twin still pending, not due, and joinable
(:func:`cosigner.approvals.superseding.join_refusal`: the same parties, at least the mask,
at least the requirement; for the common retry comparisons of the twin's stored values, no
statement more); a twin past ``expires_at`` (expiry wins: expire or escalate it first), a
twin that may not be joined (to supersede) and a twin gone since the insert found it go
back to :func:`open_request` (:class:`NeedsCore`).
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, bindparam, literal_column, select
from sqlalchemy.engine import Dialect

from cosigner.approvals.requests import event, is_due
from cosigner.approvals.superseding import join_refusal
from cosigner.approvals.views import view
from cosigner.audit.chain import Event
from cosigner.db.batch import NeedsCore
from cosigner.db.raw_sql import RawStatement
from cosigner.db.tables_approvals import approvals, reviews
from cosigner.policy.result import ApprovalRequirement

__all__ = ["PENDING_CALL", "join_raw"]

#: The pending request of one call (binds ``tenant``, ``run_id``, ``tool``, ``args_hash``).
#: A literal status, as the partial index ``uq_approvals_pending_call``'s WHERE (a bound
#: one made SQLite re-prepare the statement at each execution).
PENDING_CALL: tuple[ColumnElement[bool], ...] = (
    approvals.c.tenant == bindparam("tenant"), approvals.c.run_id == bindparam("run_id"),
    approvals.c.tool == bindparam("tool"), approvals.c.args_hash == bindparam("args_hash"),
    approvals.c.status == literal_column("'pending'"))


class PendingTwin(NamedTuple):
    """The columns of a pending request a join reads: the ``approval.joined`` event's
    (:func:`cosigner.approvals.requests.event`), the brief view's and
    :func:`cosigner.approvals.superseding.join_refusal`'s."""

    id: str
    decision_id: str
    run_id: str
    tool: str
    args_hash: str
    policy: dict[str, str] | None
    status: str
    stage: int
    requirement: dict[str, Any]
    mask: list[str]
    initiator: dict[str, Any]
    principal: dict[str, Any]
    created_at: datetime
    expires_at: datetime


class CountedReview(NamedTuple):
    """What :func:`cosigner.approvals.views.progress_of` reads of a review."""

    role: str | None
    stage: int
    decision: str


_PENDING_TWIN_RAW = RawStatement(
    select(*(approvals.c[name] for name in PendingTwin._fields)).where(*PENDING_CALL))
# Ordered as cosigner.approvals.requests.reviews_of (progress only counts, but the rows
# are then the same rows in the same order either way).
_REVIEWS_RAW = RawStatement(
    select(*(reviews.c[name] for name in CountedReview._fields))
    .where(reviews.c.approval_id == bindparam("approval_id"))
    .order_by(reviews.c.created_at, reviews.c.id))


def join_raw(raw: sqlite3.Connection, dialect: Dialect, *, tenant: str, run_id: str,
             tool: str, args_hash: str, decision_id: str, requirement: ApprovalRequirement,
             stated: dict[str, Any], mask: list[str], initiator: dict[str, Any],
             principal: dict[str, Any], opened_by: dict[str, Any], public_url: str,
             now: datetime) -> tuple[dict[str, Any], list[Event]]:
    """Join the pending request of the call (``tenant``, ``run_id``, ``tool``,
    ``args_hash``) that decision ``decision_id`` (UTC ``now``, needing ``requirement``,
    ``stated`` its :meth:`as_dict`, its arguments masked at ``mask``, proposed by
    ``initiator`` for ``principal``) found pending, inside the raw batch transaction:
    ``(the Decision's approval object {id, status, require, progress, distinct_from,
    expires_at, review_url}, [approval.joined])``, as
    :func:`cosigner.approvals.opening.open_request` joins it. Writes nothing.

    Raises:
        NeedsCore: the twin is due (``now >= expires_at``: :func:`open_request` expires or
            escalates it first), was opened for other parties, hides less than ``mask``
            or asks less than ``requirement`` in some respect (:func:`open_request`
            supersedes it: :func:`cosigner.approvals.superseding.join_refusal`), or is no
            longer pending.
        sqlalchemy.exc.DBAPIError: the driver's error, as SQLAlchemy's.
    """
    rows = _PENDING_TWIN_RAW.run(raw, dialect, {
        "tenant": tenant, "run_id": run_id, "tool": tool, "args_hash": args_hash})[0]
    if not rows:
        raise NeedsCore  # (the insert saw it pending in this very transaction)
    twin = PendingTwin(*rows[0])
    if is_due(twin, now) or join_refusal(twin, requirement, stated, mask, initiator=initiator,
                                         principal=principal) is not None:
        raise NeedsCore
    counted = [CountedReview(*row) for row in
               _REVIEWS_RAW.run(raw, dialect, {"approval_id": twin.id})[0]]
    joined = event("approval.joined", twin, opened_by, decision_id=decision_id)
    return view(twin, counted, public_url=public_url, now=now, brief=True), [joined]
