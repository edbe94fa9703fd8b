"""Approval requests: the state machine, reviews, cancel and expiry.

Opening (and joining) requests is :mod:`cosigner.approvals.opening`; reads are
:mod:`cosigner.approvals.queries`.

States (DESIGN § Wire contracts)::

    pending → approved | rejected | expired | cancelled      (terminal states never change)

:data:`TRANSITIONS` is the whole machine; :func:`transition` refuses anything else and every
change is a conditional ``UPDATE ... WHERE status = <from>``, so on several replicas at most
one writer moves a request. A write first locks the request row (PostgreSQL ``FOR UPDATE``;
SQLite's ``BEGIN IMMEDIATE`` already serialises writers), so concurrent reviews that complete
a quorum mint exactly one permit.

Expiry wins (invariant 5): at ``now >= expires_at`` a request is expired whatever arrives at
that instant; the request is moved to ``expired`` by whoever notices first (a review, a read,
the periodic sweep :func:`expire_due`).

:func:`review` is the one function the JSON API and the web form call; the rules themselves
are in :mod:`cosigner.approvals.rules`. Every attempt, accepted or refused, is a decision-log event
committed in the same transaction as the state change it records.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.approvals import rules as review_rules
from cosigner.approvals.views import display_args, view
from cosigner.audit.chain import Event, append
from cosigner.core.errors import (
    ApprovalStateError,
    CosignerError,
    InvalidRequest,
    NotFound,
    ReviewRefused,
)
from cosigner.db.tables_approvals import approvals, reviews
from cosigner.identity.principals import Caller
from cosigner.permits import ledger as permit_ledger
from cosigner.policy import quorum
from cosigner.policy.result import parse_requirement

if TYPE_CHECKING:
    from cosigner.context import AppContext
    from cosigner.core.settings import Settings
    from cosigner.db.database import Database

__all__ = ["STATES", "SYSTEM_ACTOR", "TERMINAL", "TRANSITIONS", "aware", "cancel",
           "display_args", "event", "expire", "expire_due", "expire_if_due", "is_due", "load",
           "notify", "review", "reviews_of", "transition"]

log = logging.getLogger("cosigner.approvals")

STATES = ("pending", "approved", "rejected", "expired", "cancelled")
TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"approved", "rejected", "expired", "cancelled"}),
    "approved": frozenset(),
    "rejected": frozenset(),
    "expired": frozenset(),
    "cancelled": frozenset(),
}
TERMINAL = frozenset(state for state, nxt in TRANSITIONS.items() if not nxt)
SYSTEM_ACTOR: dict[str, Any] = {"subject": "system", "principal_id": None, "kind": "system"}
MAX_COMMENT_CHARS = 2000


def aware(moment: datetime) -> datetime:
    """SQLite returns naive datetimes; every stored time is UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def is_due(row: Any, now: datetime) -> bool:
    """Expiry wins at the instant itself: ``now >= expires_at``."""
    return bool(row.status == "pending" and now >= aware(row.expires_at))


async def transition(conn: AsyncConnection, row: Any, target: str, *, now: datetime,
                     **values: Any) -> bool:
    """Move ``row`` from its status to ``target`` if the table allows it and nobody else did.

    Returns ``False`` when another writer changed the status first.

    Raises:
        ApprovalStateError: ``target`` is not reachable from the row's status.
    """
    if target not in TRANSITIONS.get(row.status, frozenset()):
        raise ApprovalStateError(f"approval is {row.status}", code="approval_not_pending")
    result = await conn.execute(
        approvals.update()
        .where(approvals.c.id == row.id, approvals.c.status == row.status)
        .values(status=target, decided_at=now, **values))
    return bool(result.rowcount == 1)


def event(event_type: str, row: Any, who: dict[str, Any], **payload: Any) -> Event:
    return Event(type=event_type, actor=who, decision_id=row.decision_id, approval_id=row.id,
                 run_id=row.run_id, tool=row.tool, args_hash=row.args_hash,
                 policy=row.policy, payload=payload)


async def load(conn: AsyncConnection, tenant: str, approval_id: str, *,
                lock: bool) -> Any:
    query = select(approvals).where(approvals.c.id == approval_id, approvals.c.tenant == tenant)
    if lock and conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return (await conn.execute(query)).first()


async def reviews_of(conn: AsyncConnection, approval_id: str) -> list[Any]:
    """Reviews of one request, oldest first."""
    return list((await conn.execute(
        select(reviews).where(reviews.c.approval_id == approval_id)
        .order_by(reviews.c.created_at, reviews.c.id))).all())


async def expire(conn: AsyncConnection, row: Any, now: datetime,
                  who: dict[str, Any]) -> list[Event]:
    if not await transition(conn, row, "expired", now=now):
        return []
    return [event("approval.expired", row, who, expires_at=aware(row.expires_at).isoformat())]


async def notify(conn: AsyncConnection, settings: Settings, row: Any, event_type: str,
                  now: datetime, *, status: str | None = None,
                  decided_by: list[str] | None = None) -> None:
    """Queue a webhook (masked args only) in the same transaction as the state change."""
    from cosigner.webhooks import outbox

    if not outbox.targets(settings, row.tenant):
        return
    approval: dict[str, Any] = {
        "id": row.id, "tool": row.tool, "args": display_args(row.args, row.mask),
        "args_hash": row.args_hash, "status": status or row.status,
        "expires_at": aware(row.expires_at).isoformat()}
    if decided_by is not None:
        approval["decided_by"] = decided_by
    await outbox.enqueue(conn, settings, tenant=row.tenant, event_type=event_type,
                         approval=approval, now=now)


# --- reviewing ----------------------------------------------------------------------------


async def _previous_approvers(conn: AsyncConnection, row: Any) -> frozenset[str]:
    found = (await conn.execute(
        select(reviews.c.subject).where(
            reviews.c.tenant == row.tenant, reviews.c.run_id == row.run_id,
            reviews.c.decision == "approved", reviews.c.role.is_not(None),
            reviews.c.approval_id != row.id))).scalars().all()
    return frozenset(found)


async def review(deps: AppContext, caller: Caller, approval_id: str, *, decision: str,
                 comment: str = "") -> dict[str, Any]:
    """Record ``caller``'s review of a request; the identity is the caller's credential.

    ``decision`` is ``approved`` or ``rejected``. One rejection rejects; when every group is
    met the request is approved and a permit is minted in the same transaction (claims
    ``approvers [{id, role, at}]``, ``exp`` = the request's remaining validity, capped by
    ``max_permit_ttl_s``). Refused attempts are logged (``approval.review_refused``) and
    committed before the error is raised.

    Returns the approval state (:func:`cosigner.approvals.views.view`).

    Raises:
        InvalidRequest: ``invalid_decision``, ``comment_required`` (reject without comment),
            ``comment_too_long``.
        NotFound: no such request in the caller's tenant.
        ReviewRefused: ``not_eligible``, ``self_approval``, ``previous_approver``,
            ``duplicate_review``, ``role_already_met``.
        ApprovalStateError: ``approval_expired`` (at or after ``expires_at``),
            ``approval_not_pending`` (terminal).
    """
    if decision not in ("approved", "rejected"):
        raise InvalidRequest("decision must be approved or rejected", code="invalid_decision")
    if len(comment) > MAX_COMMENT_CHARS:
        raise InvalidRequest(f"comment longer than {MAX_COMMENT_CHARS} characters",
                             code="comment_too_long")
    if decision == "rejected" and not comment.strip():
        raise InvalidRequest("a rejection needs a comment", code="comment_required")
    now = deps.clock()
    who = caller.actor()
    refusal: CosignerError | None = None
    state: dict[str, Any] = {}
    async with deps.db.transaction() as conn:
        row = await load(conn, caller.tenant, approval_id, lock=True)
        if row is None:
            refusal = NotFound("no such approval request")
            events = [Event(type="approval.review_refused", actor=who,
                            payload={"code": "not_found", "decision": decision})]
        else:
            refusal, events = await _review_locked(deps, conn, caller, row, decision,
                                                   comment, now)
            fresh = await load(conn, caller.tenant, approval_id, lock=False)
            state = view(fresh, await reviews_of(conn, approval_id),
                         public_url=deps.settings.public_url, now=now,
                         include_permit=caller.has_any("runtime"))
        await append(conn, caller.tenant, events, now=now)
    if refusal is not None:
        raise refusal
    return state


def _refused(row: Any, who: dict[str, Any], decision: str,
             error: CosignerError) -> tuple[CosignerError, list[Event]]:
    return error, [event("approval.review_refused", row, who, code=error.code,
                          decision=decision)]


async def _review_locked(deps: AppContext, conn: AsyncConnection, caller: Caller, row: Any,
                         decision: str, comment: str, now: datetime
                         ) -> tuple[CosignerError | None, list[Event]]:
    who = caller.actor()
    requirement = parse_requirement(row.requirement)
    held = caller.roles & quorum.required_roles(requirement)
    if not held:
        return _refused(row, who, decision, ReviewRefused(
            "you hold none of the roles this request needs", code="not_eligible"))
    if is_due(row, now):
        expired = await expire(conn, row, now, SYSTEM_ACTOR)
        error, refused = _refused(row, who, decision, ApprovalStateError(
            "the approval request has expired", code="approval_expired"))
        return error, expired + refused
    if row.status != "pending":
        code = "approval_expired" if row.status == "expired" else "approval_not_pending"
        return _refused(row, who, decision, ApprovalStateError(
            f"the approval request is {row.status}", code=code))
    existing = await reviews_of(conn, row.id)
    ctx = review_rules.ReviewContext(
        requirement=requirement, initiator_id=str(row.initiator.get("id")),
        principal_id=str(row.principal.get("id")),
        opened_by=str(row.opened_by.get("subject")),
        previous_approvers=await _previous_approvers(conn, row),
        reviewed=frozenset(r.subject for r in existing))
    refusal = review_rules.refusal_code(ctx, subject=caller.subject, roles=held,
                                        decision=decision)
    if refusal is not None:
        return _refused(row, who, decision,
                        ReviewRefused(_REFUSAL_TEXT[refusal], code=refusal))
    if decision == "rejected":
        await _insert_review(conn, row, caller, held, None, decision, comment, now)
        await transition(conn, row, "rejected", now=now)
        await notify(conn, deps.settings, row, "approval.decided", now, status="rejected",
                      decided_by=[caller.subject])
        return None, [event("approval.reviewed", row, who, decision=decision, role=None,
                             comment=comment),
                      event("approval.rejected", row, who)]
    approving = [(r.subject, frozenset(r.roles)) for r in existing if r.decision == "approved"]
    assignment = quorum.match([*approving, (caller.subject, held)], requirement.require)
    if caller.subject not in assignment:
        return _refused(row, who, decision, ReviewRefused(
            "the groups you could count for are already met", code="role_already_met"))
    await _insert_review(conn, row, caller, held, assignment[caller.subject], decision,
                         comment, now)
    for earlier in existing:  # a new approver may shift who counts for which group
        if earlier.decision == "approved" and earlier.role != assignment.get(earlier.subject):
            await conn.execute(reviews.update().where(reviews.c.id == earlier.id)
                               .values(role=assignment.get(earlier.subject)))
    events = [event("approval.reviewed", row, who, decision=decision,
                     role=assignment[caller.subject], comment=comment,
                     progress=quorum.progress(requirement.require, assignment))]
    if quorum.is_met(requirement.require, assignment):
        events += await _approve(deps, conn, row, assignment, now, who)
    return None, events


_REFUSAL_TEXT = {
    "not_eligible": "you hold none of the roles this request needs",
    "self_approval": "the requester, initiator or principal cannot review this request",
    "previous_approver": "you already approved a call in this run",
    "duplicate_review": "you already reviewed this request",
}


async def _insert_review(conn: AsyncConnection, row: Any, caller: Caller, held: frozenset[str],
                         role: str | None, decision: str, comment: str,
                         now: datetime) -> None:
    await conn.execute(reviews.insert().values(
        id=str(uuid.uuid4()), approval_id=row.id, tenant=row.tenant, run_id=row.run_id,
        subject=caller.subject, principal_id=caller.principal_id, roles=sorted(held),
        role=role, decision=decision, comment=comment, created_at=now))


async def _approve(deps: AppContext, conn: AsyncConnection, row: Any, assignment: dict[str, str],
                   now: datetime, who: dict[str, Any]) -> list[Event]:
    rows = await reviews_of(conn, row.id)
    approvers = [{"id": r.subject, "role": assignment[r.subject], "at": aware(r.created_at)}
                 for r in rows if r.subject in assignment]
    remaining = int((aware(row.expires_at) - now).total_seconds())
    ttl = max(1, min(remaining, deps.settings.max_permit_ttl_s,
                     deps.keyring.max_token_lifetime_s))
    permit, minted = await permit_ledger.issue(
        conn, deps.keyring, deps.settings, tenant=row.tenant, run_id=row.run_id,
        decision_id=row.decision_id, approval_id=row.id, tool=row.tool,
        args_hash=row.args_hash, policy=row.policy or {}, approvers=approvers, now=now,
        ttl_s=ttl, actor=who)
    if not await transition(conn, row, "approved", now=now, permit_jti=permit["jti"],
                            permit=permit):
        raise ApprovalStateError("the approval request changed state",
                                 code="approval_not_pending")
    await notify(conn, deps.settings, row, "approval.decided", now, status="approved",
                  decided_by=[a["id"] for a in approvers])
    return [event("approval.approved", row, who,
                   approvers=[{**a, "at": a["at"].isoformat()} for a in approvers]), minted]


# --- cancel and expiry --------------------------------------------------------------------


async def cancel(deps: AppContext, caller: Caller, approval_id: str) -> dict[str, Any]:
    """Cancel a pending request (``runtime`` role of the same tenant).

    Raises:
        Forbidden, NotFound, ApprovalStateError (``approval_expired``,
        ``approval_not_pending``).
    """
    caller.require("runtime")
    now = deps.clock()
    who = caller.actor()
    error: CosignerError | None = None
    async with deps.db.transaction() as conn:
        row = await load(conn, caller.tenant, approval_id, lock=True)
        if row is None:
            raise NotFound("no such approval request")
        if is_due(row, now):
            events = await expire(conn, row, now, SYSTEM_ACTOR)
            error = ApprovalStateError("the approval request has expired",
                                       code="approval_expired")
        elif row.status != "pending":
            raise ApprovalStateError(f"the approval request is {row.status}",
                                     code="approval_expired" if row.status == "expired"
                                     else "approval_not_pending")
        else:
            await transition(conn, row, "cancelled", now=now)
            events = [event("approval.cancelled", row, who)]
        await append(conn, caller.tenant, events, now=now)
        fresh = await load(conn, caller.tenant, approval_id, lock=False)
        state = view(fresh, await reviews_of(conn, approval_id),
                     public_url=deps.settings.public_url, now=now)
    if error is not None:
        raise error
    return state


async def expire_due(db: Database, now: datetime, *, limit: int = 500) -> int:
    """Move pending requests with ``expires_at <= now`` to ``expired``; return how many.

    Reads first so an idle sweep takes no write lock. Each expiry is an
    ``approval.expired`` event in its tenant's log, committed with the change.
    """
    async with db.read() as conn:
        due = (await conn.execute(
            select(approvals.c.id, approvals.c.tenant).where(
                approvals.c.status == "pending", approvals.c.expires_at <= now)
            .limit(limit))).all()
    if not due:
        return 0
    count = 0
    async with db.transaction() as conn:
        by_tenant: dict[str, list[Event]] = {}
        # Same lock order as every other writer: rows by (tenant, id), then log heads
        # by tenant, so a sweep never forms a lock cycle with a decision batch.
        for item in sorted(due, key=lambda d: (d.tenant, d.id)):
            row = await load(conn, item.tenant, item.id, lock=True)
            if row is not None and is_due(row, now):
                events = await expire(conn, row, now, SYSTEM_ACTOR)
                by_tenant.setdefault(row.tenant, []).extend(events)
                count += len(events)
        for tenant in sorted(by_tenant):
            if by_tenant[tenant]:
                await append(conn, tenant, by_tenant[tenant], now=now)
    return count


async def expire_if_due(deps: AppContext, tenant: str, approval_id: str) -> None:
    """Expire one request now if it is due (used by reads that notice it)."""
    now = deps.clock()
    async with deps.db.transaction() as conn:
        row = await load(conn, tenant, approval_id, lock=True)
        if row is not None and is_due(row, now):
            await append(conn, tenant, await expire(conn, row, now, SYSTEM_ACTOR), now=now)
