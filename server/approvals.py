"""Approval requests: the state machine, opening/joining, reviews, cancel and expiry.

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
are in :mod:`server.review_rules`. Every attempt, accepted or refused, is a decision-log event
committed in the same transaction as the state change it records.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from server import permit_ledger, review_rules
from server.approval_views import display_args, progress_of, view
from server.audit.chain import Event, append
from server.canonical import canonicalize
from server.db.tables import decisions
from server.db.tables_approvals import approvals, reviews
from server.errors import (
    ApprovalStateError,
    Conflict,
    CosignerError,
    InvalidRequest,
    NotFound,
    PolicyError,
    ReviewRefused,
)
from server.policy.result import ApprovalRequirement, parse_requirement
from server.principals import Caller

if TYPE_CHECKING:
    from server.db.database import Database
    from server.decisions import Deps
    from server.settings import Settings

__all__ = ["STATES", "TERMINAL", "TRANSITIONS", "cancel", "display_args", "expire_due",
           "open_request", "request_review", "review", "transition"]

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


def actor(caller: Caller) -> dict[str, Any]:
    """The ``actor`` recorded in events (same shape as :func:`server.decisions.actor_of`)."""
    return {"subject": caller.subject, "principal_id": caller.principal_id, "kind": caller.kind}


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


def _event(event_type: str, row: Any, who: dict[str, Any], **payload: Any) -> Event:
    return Event(type=event_type, actor=who, decision_id=row.decision_id, approval_id=row.id,
                 run_id=row.run_id, tool=row.tool, args_hash=row.args_hash,
                 policy=row.policy, payload=payload)


async def _load(conn: AsyncConnection, tenant: str, approval_id: str, *,
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


async def _expire(conn: AsyncConnection, row: Any, now: datetime,
                  who: dict[str, Any]) -> list[Event]:
    if not await transition(conn, row, "expired", now=now):
        return []
    return [_event("approval.expired", row, who, expires_at=aware(row.expires_at).isoformat())]


# --- opening ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallFacts:
    """The call an approval request is about, as the server recorded it."""

    tenant: str
    decision_id: str
    run_id: str
    tool: str
    args: dict[str, Any]
    args_hash: str
    mask: tuple[str, ...]
    initiator: dict[str, Any]
    principal: dict[str, Any]
    policy: dict[str, str] | None
    reasons: list[dict[str, str]]


async def _pending_for_call(conn: AsyncConnection, call: CallFacts) -> Any:
    query = select(approvals).where(
        approvals.c.tenant == call.tenant, approvals.c.run_id == call.run_id,
        approvals.c.tool == call.tool, approvals.c.args_hash == call.args_hash,
        approvals.c.status == "pending")
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return (await conn.execute(query)).first()


async def open_request(conn: AsyncConnection, settings: Settings, *, call: CallFacts,
                       requirement: ApprovalRequirement, opened_by: dict[str, Any],
                       now: datetime, kind: str = "policy",
                       reason: str | None = None) -> tuple[dict[str, Any], list[Event]]:
    """Open an approval request for ``call`` inside the caller's transaction, or join the
    identical pending one (same tenant, run, tool, args hash): same id, no new request.

    Returns ``(approval object of the Decision, events)``; the events are
    ``approval.requested`` or ``approval.joined`` (plus ``approval.expired`` when the pending
    twin had run out). A concurrent insert of the twin is settled by the partial unique index
    ``uq_approvals_pending_call``: the loser's insert does nothing and it joins the winner.
    Only a new request notifies (webhook ``approval.pending``, queued in this transaction).
    """
    public_url = settings.public_url
    events: list[Event] = []
    existing = await _pending_for_call(conn, call)
    if existing is not None and is_due(existing, now):
        events += await _expire(conn, existing, now, SYSTEM_ACTOR)
        existing = None
    if existing is None:
        approval_id = str(uuid.uuid4())
        expires_at = now + timedelta(milliseconds=requirement.timeout_ms)
        insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
        stmt = insert(approvals).values(
            id=approval_id, tenant=call.tenant, kind=kind, decision_id=call.decision_id,
            run_id=call.run_id, tool=call.tool, args_hash=call.args_hash,
            args=canonicalize(call.args).decode(), mask=list(call.mask),
            requirement=requirement.as_dict(), status="pending", initiator=call.initiator,
            principal=call.principal, opened_by=opened_by, reasons=call.reasons,
            policy=call.policy, reason=reason, created_at=now, expires_at=expires_at,
        ).on_conflict_do_nothing(
            index_elements=["tenant", "run_id", "tool", "args_hash"],
            index_where=text("status = 'pending'"),
        ).returning(approvals.c.id)
        if (await conn.execute(stmt)).first() is not None:
            row = await _load(conn, call.tenant, approval_id, lock=False)
            events.append(_event("approval.requested", row, opened_by, kind=kind,
                                 requirement=requirement.as_dict(),
                                 expires_at=expires_at.isoformat(), reason=reason))
            await _notify(conn, settings, row, "approval.pending", now)
            return view(row, [], public_url=public_url, now=now, brief=True), events
        existing = await _pending_for_call(conn, call)
        if existing is None:  # the twin was decided between our insert and this read
            raise Conflict("a concurrent approval request changed state; retry",
                           code="approval_race")
    events.append(_event("approval.joined", existing, opened_by,
                         decision_id=call.decision_id))
    rows = await reviews_of(conn, existing.id)
    return view(existing, rows, public_url=public_url, now=now, brief=True), events


async def request_review(deps: Deps, caller: Caller, *, decision_id: str,
                         reason: str) -> dict[str, Any]:
    """A runtime asks for human review of a call the policy allowed.

    The decision's unredeemed permit is revoked (withheld) and a ``runtime_review`` request
    opens with the active bundle's ``[review]`` requirement; once approved a new permit is
    minted. Asking twice for the same decision returns the first request.

    Raises:
        Forbidden: caller lacks the ``runtime`` role. NotFound: no such decision in the
        caller's tenant. InvalidRequest ``not_an_allow_decision``. PolicyError
        ``no_review_requirement`` (the bundle declares no ``[review]``). Conflict
        ``already_redeemed`` (the call already ran).
    """
    caller.require("runtime")
    now = deps.clock()
    async with deps.db.transaction() as conn:
        decision = (await conn.execute(select(decisions).where(
            decisions.c.id == decision_id, decisions.c.tenant == caller.tenant))).first()
        if decision is None:
            raise NotFound("no such decision")
        if decision.effect != "allow":
            raise InvalidRequest("only an allow decision can be sent for review",
                                 code="not_an_allow_decision")
        earlier = (await conn.execute(select(approvals).where(
            approvals.c.tenant == caller.tenant, approvals.c.decision_id == decision_id,
            approvals.c.kind == "runtime_review"))).first()
        if earlier is not None:
            return view(earlier, await reviews_of(conn, earlier.id),
                        public_url=deps.settings.public_url, now=now)
        bundle = deps.store.snapshot.bundle_for(caller.tenant)
        requirement = bundle.manifest.review if bundle is not None else None
        if requirement is None:
            raise PolicyError("the active policy bundle declares no [review] requirement",
                              code="no_review_requirement")
        stored = await permit_ledger.load_call_input(conn, caller.tenant, decision_id)
        if stored is None:
            raise PolicyError("the decision's input was not recorded", code="policy_error")
        input_doc, mask = stored
        events = await permit_ledger.withhold(conn, tenant=caller.tenant,
                                              decision_id=decision_id, now=now,
                                              actor=actor(caller))
        call = CallFacts(
            tenant=caller.tenant, decision_id=decision_id, run_id=decision.run_id,
            tool=decision.tool, args=input_doc["args"], args_hash=decision.args_hash,
            mask=tuple(mask), initiator=input_doc["initiator"],
            principal=input_doc["principal"], policy=bundle.ref() if bundle else None,
            reasons=[{"code": "review_requested", "message": reason[:500]}])
        brief, opened = await open_request(
            conn, deps.settings, call=call, requirement=requirement, opened_by=actor(caller),
            now=now, kind="runtime_review", reason=reason[:500])
        await append(conn, caller.tenant, events + opened, now=now)
        row = await _load(conn, caller.tenant, brief["id"], lock=False)
        return view(row, await reviews_of(conn, row.id), public_url=deps.settings.public_url,
                    now=now, include_permit=True)


async def record_gate(conn: AsyncConnection, settings: Settings, caller: Caller, *,
                      response: dict[str, Any], requirement: ApprovalRequirement | None,
                      input_doc: dict[str, Any], mask: tuple[str, ...],
                      now: datetime) -> list[Event]:
    """Called by ``decisions.decide`` inside its transaction, before the decision event.

    For ``allow`` and ``require_approval`` the policy input is stored (redeem re-checks the
    active policy on it); for ``require_approval`` the request is opened or joined and
    ``response["approval"]`` becomes its brief state. Returns the approval events.
    """
    effect = response["effect"]
    if effect not in ("allow", "require_approval"):
        return []
    decision_id = response["decision_id"]
    await permit_ledger.store_call_input(conn, tenant=caller.tenant, decision_id=decision_id,
                                         input_doc=input_doc, mask=mask)
    if effect != "require_approval" or requirement is None:
        return []
    call = CallFacts(
        tenant=caller.tenant, decision_id=decision_id, run_id=input_doc["run"]["id"],
        tool=input_doc["tool"]["name"], args=input_doc["args"],
        args_hash=response["args_hash"], mask=mask, initiator=input_doc["initiator"],
        principal=input_doc["principal"], policy=response["policy"],
        reasons=response["reasons"])
    response["approval"], events = await open_request(
        conn, settings, call=call, requirement=requirement, opened_by=actor(caller), now=now)
    return events


async def _notify(conn: AsyncConnection, settings: Settings, row: Any, event_type: str,
                  now: datetime, *, status: str | None = None,
                  decided_by: list[str] | None = None) -> None:
    """Queue a webhook (masked args only) in the same transaction as the state change."""
    from server.webhooks import outbox

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


async def review(deps: Deps, caller: Caller, approval_id: str, *, decision: str,
                 comment: str = "") -> dict[str, Any]:
    """Record ``caller``'s review of a request; the identity is the caller's credential.

    ``decision`` is ``approved`` or ``rejected``. One rejection rejects; when every group is
    met the request is approved and a permit is minted in the same transaction (claims
    ``approvers [{id, role, at}]``, ``exp`` = the request's remaining validity, capped by
    ``max_permit_ttl_s``). Refused attempts are logged (``approval.review_refused``) and
    committed before the error is raised.

    Returns the approval state (:func:`server.approval_views.view`).

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
    who = actor(caller)
    refusal: CosignerError | None = None
    state: dict[str, Any] = {}
    async with deps.db.transaction() as conn:
        row = await _load(conn, caller.tenant, approval_id, lock=True)
        if row is None:
            refusal = NotFound("no such approval request")
            events = [Event(type="approval.review_refused", actor=who,
                            payload={"code": "not_found", "decision": decision})]
        else:
            refusal, events = await _review_locked(deps, conn, caller, row, decision,
                                                   comment, now)
            fresh = await _load(conn, caller.tenant, approval_id, lock=False)
            state = view(fresh, await reviews_of(conn, approval_id),
                         public_url=deps.settings.public_url, now=now,
                         include_permit=caller.has_any("runtime"))
        await append(conn, caller.tenant, events, now=now)
    if refusal is not None:
        raise refusal
    return state


def _refused(row: Any, who: dict[str, Any], decision: str,
             error: CosignerError) -> tuple[CosignerError, list[Event]]:
    return error, [_event("approval.review_refused", row, who, code=error.code,
                          decision=decision)]


async def _review_locked(deps: Deps, conn: AsyncConnection, caller: Caller, row: Any,
                         decision: str, comment: str, now: datetime
                         ) -> tuple[CosignerError | None, list[Event]]:
    who = actor(caller)
    requirement = parse_requirement(row.requirement)
    held = caller.roles & review_rules.required_roles(requirement)
    if not held:
        return _refused(row, who, decision, ReviewRefused(
            "you hold none of the roles this request needs", code="not_eligible"))
    if is_due(row, now):
        expired = await _expire(conn, row, now, SYSTEM_ACTOR)
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
        await _notify(conn, deps.settings, row, "approval.decided", now, status="rejected",
                      decided_by=[caller.subject])
        return None, [_event("approval.reviewed", row, who, decision=decision, role=None,
                             comment=comment),
                      _event("approval.rejected", row, who)]
    approving = [(r.subject, frozenset(r.roles)) for r in existing if r.decision == "approved"]
    assignment = review_rules.match([*approving, (caller.subject, held)], requirement.require)
    if caller.subject not in assignment:
        return _refused(row, who, decision, ReviewRefused(
            "the groups you could count for are already met", code="role_already_met"))
    await _insert_review(conn, row, caller, held, assignment[caller.subject], decision,
                         comment, now)
    for earlier in existing:  # a new approver may shift who counts for which group
        if earlier.decision == "approved" and earlier.role != assignment.get(earlier.subject):
            await conn.execute(reviews.update().where(reviews.c.id == earlier.id)
                               .values(role=assignment.get(earlier.subject)))
    events = [_event("approval.reviewed", row, who, decision=decision,
                     role=assignment[caller.subject], comment=comment,
                     progress=review_rules.progress(requirement.require, assignment))]
    if review_rules.is_met(requirement.require, assignment):
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


async def _approve(deps: Deps, conn: AsyncConnection, row: Any, assignment: dict[str, str],
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
    await _notify(conn, deps.settings, row, "approval.decided", now, status="approved",
                  decided_by=[a["id"] for a in approvers])
    return [_event("approval.approved", row, who,
                   approvers=[{**a, "at": a["at"].isoformat()} for a in approvers]), minted]


# --- cancel and expiry --------------------------------------------------------------------


async def cancel(deps: Deps, caller: Caller, approval_id: str) -> dict[str, Any]:
    """Cancel a pending request (``runtime`` role of the same tenant).

    Raises:
        Forbidden, NotFound, ApprovalStateError (``approval_expired``,
        ``approval_not_pending``).
    """
    caller.require("runtime")
    now = deps.clock()
    who = actor(caller)
    error: CosignerError | None = None
    async with deps.db.transaction() as conn:
        row = await _load(conn, caller.tenant, approval_id, lock=True)
        if row is None:
            raise NotFound("no such approval request")
        if is_due(row, now):
            events = await _expire(conn, row, now, SYSTEM_ACTOR)
            error = ApprovalStateError("the approval request has expired",
                                       code="approval_expired")
        elif row.status != "pending":
            raise ApprovalStateError(f"the approval request is {row.status}",
                                     code="approval_expired" if row.status == "expired"
                                     else "approval_not_pending")
        else:
            await transition(conn, row, "cancelled", now=now)
            events = [_event("approval.cancelled", row, who)]
        await append(conn, caller.tenant, events, now=now)
        fresh = await _load(conn, caller.tenant, approval_id, lock=False)
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
        for item in due:
            row = await _load(conn, item.tenant, item.id, lock=True)
            if row is not None and is_due(row, now):
                events = await _expire(conn, row, now, SYSTEM_ACTOR)
                by_tenant.setdefault(row.tenant, []).extend(events)
                count += len(events)
        for tenant, events in by_tenant.items():
            if events:
                await append(conn, tenant, events, now=now)
    return count


async def expire_if_due(deps: Deps, tenant: str, approval_id: str) -> None:
    """Expire one request now if it is due (used by reads that notice it)."""
    now = deps.clock()
    async with deps.db.transaction() as conn:
        row = await _load(conn, tenant, approval_id, lock=True)
        if row is not None and is_due(row, now):
            await append(conn, tenant, await _expire(conn, row, now, SYSTEM_ACTOR), now=now)


__all__ += ["CallFacts", "actor", "aware", "is_due", "progress_of", "reviews_of",
            "expire_if_due"]
