"""Reviews of approval requests, and cancelling them.

:func:`review` is the one function the JSON API and the web form call; the rules themselves
are in :mod:`cosigner.approvals.rules` (separation of duties) and
:mod:`cosigner.policy.quorum` (counting). A write first locks the request row (PostgreSQL
``FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` already serialises writers), so concurrent
reviews that complete a quorum mint exactly one permit. Every attempt, accepted or refused,
is a decision-log event committed in the same transaction as the state change it records.

The request's states and transitions are :mod:`cosigner.approvals.requests`; opening (and
joining) requests is :mod:`cosigner.approvals.opening`; reads are
:mod:`cosigner.approvals.queries`.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.approvals import rules as review_rules
from cosigner.approvals import signatures as review_signatures
from cosigner.approvals import standing as standing_rules
from cosigner.approvals import stepup
from cosigner.approvals.requests import (
    SYSTEM_ACTOR,
    aware,
    event,
    expire,
    is_due,
    load,
    notify,
    permit_of,
    reviews_of,
    stage_of,
    transition,
)
from cosigner.approvals.views import display_args, view
from cosigner.audit.chain import Event, append
from cosigner.core.errors import (
    ApprovalStateError,
    CosignerError,
    InvalidRequest,
    NotFound,
    ReviewRefused,
)
from cosigner.core.ids import new_id
from cosigner.db.tables_approvals import REVIEWED_REQUESTS, approvals, reviews
from cosigner.identity.principals import Caller
from cosigner.permits import ledger as permit_ledger
from cosigner.policy import quorum
from cosigner.policy.result import parse_requirement

if TYPE_CHECKING:
    from cosigner.context import AppContext

__all__ = ["cancel", "display_args", "review"]

log = logging.getLogger("cosigner.approvals")

MAX_COMMENT_CHARS = 2000


# --- reviewing ----------------------------------------------------------------------------


_RUN_LOCK = text("SELECT pg_advisory_xact_lock(:key)")


def _run_lock_key(tenant: str, run_id: str) -> int:
    """The advisory lock of one run's reviews (a signed 64-bit key; two runs sharing one
    only wait for each other)."""
    digest = hashlib.sha256(b"cosigner-run-reviews\0" + tenant.encode() + b"\0"
                            + run_id.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def _previous_approvers(conn: AsyncConnection, row: Any) -> frozenset[str]:
    """Subjects who approved another request of ``row``'s run, whatever that request
    became (approved, expired, cancelled, rejected, pending): a request ending never frees
    its approvers. An approval voided by superseding (``role`` null) counts toward every
    call of the run but its own (:func:`cosigner.approvals.rules.counts_as_previous`).

    Reviews of one run are serialised from here to their commit: the row lock only
    serialises reviews of the same request, so on PostgreSQL (READ COMMITTED) two
    concurrent approvals by one person of two calls of the run would each read the other
    as not yet given and both be accepted. A transaction-scoped advisory lock of the run
    makes the second wait, then read the first. (SQLite: ``BEGIN IMMEDIATE`` already
    serialises every writer.)"""
    if conn.dialect.name == "postgresql":
        await conn.execute(_RUN_LOCK, {"key": _run_lock_key(row.tenant, row.run_id)})
    found = (await conn.execute(
        select(reviews.c.subject, reviews.c.role, approvals.c.tool, approvals.c.args_hash)
        .select_from(REVIEWED_REQUESTS)
        .where(reviews.c.tenant == row.tenant, reviews.c.run_id == row.run_id,
               reviews.c.decision == "approved", reviews.c.approval_id != row.id))).all()
    return frozenset(
        f.subject for f in found if review_rules.counts_as_previous(
            voided=f.role is None, same_call=(f.tool, f.args_hash) == (row.tool,
                                                                       row.args_hash)))


async def review(deps: AppContext, caller: Caller, approval_id: str, *, decision: str,
                 comment: str = "", standing: dict[str, Any] | None = None,
                 assertion: Any = None) -> dict[str, Any]:
    """Record ``caller``'s review of a request; the identity is the caller's credential.

    ``decision`` is ``approved`` or ``rejected``. One rejection rejects; when every group is
    met the request is approved and a permit is minted in the same transaction (claims
    ``approvers [{id, role, at}]``, ``exp`` = the request's remaining validity, capped by
    ``max_permit_ttl_s``). Refused attempts are logged (``approval.review_refused``) and
    committed before the error is raised.

    ``standing``: a bounded standing approval to grant with this approval
    (:mod:`cosigner.approvals.standing`); refused (``invalid_standing``,
    ``standing_not_allowed``, ``standing_needs_one_approver``, ``standing_masked_path``,
    ``standing_mismatch``) and logged before anything is recorded.

    ``assertion``: the WebAuthn assertion (browser JSON) signing this review's statement
    (:mod:`cosigner.approvals.signatures`). An approval counts for a group asking
    ``signature: "webauthn"`` only with a valid one; without it, it counts only for the
    groups that do not ask (``signature_required`` when there are none). A given assertion
    is always checked (a signed rejection too), and recorded on the review, its event and
    the permit's ``approvers`` entry.
    Every event of an attempt records the caller's ``authn`` (method, and for single
    sign-on ``acr``/``amr``/``auth_time``).

    Returns the approval state (:func:`cosigner.approvals.views.view`).

    Raises:
        InvalidRequest: ``invalid_decision``, ``comment_required`` (reject without comment),
            ``comment_too_long``.
        NotFound: no such request in the caller's tenant.
        ReviewRefused: ``not_eligible``, ``self_approval``, ``previous_approver``,
            ``duplicate_review``, ``role_already_met``, ``step_up_required`` (403: the
            stage asks for a stronger or fresher sign-in than the caller's,
            :mod:`cosigner.approvals.stepup`; ``step_up`` in the problem says what), and
            the signed-review codes (``signature_required``, ``signature_invalid``,
            ``signature_challenge_mismatch``, ``signature_replayed``, ``signature_expired``,
            ``unknown_credential``, ``credential_removed``).
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
                            payload={"code": "not_found", "decision": decision,
                                     "authn": caller.authn.record()})]
        else:
            refusal, events = await _review_locked(deps, conn, caller, row, decision,
                                                   comment, now, standing, assertion)
            fresh = await load(conn, caller.tenant, approval_id, lock=False)
            state = view(fresh, await reviews_of(conn, approval_id),
                         public_url=deps.settings.public_url, now=now,
                         include_permit=caller.has_any("runtime"),
                         permit_row=await permit_of(conn, fresh))
        await append(conn, caller.tenant, events, now=now)
    if refusal is not None:
        raise refusal
    return state


def _refused(row: Any, caller: Caller, decision: str,
             error: CosignerError) -> tuple[CosignerError, list[Event]]:
    return error, [event("approval.review_refused", row, caller.actor(), code=error.code,
                          decision=decision, authn=caller.authn.record())]


async def _review_locked(deps: AppContext, conn: AsyncConnection, caller: Caller, row: Any,
                         decision: str, comment: str, now: datetime,
                         standing: dict[str, Any] | None, assertion: Any = None
                         ) -> tuple[CosignerError | None, list[Event]]:
    """End a due stage first (expiry wins): a review arriving at or after a stage's end
    never counts for that stage. After an escalation it is judged against the new stage;
    after the last stage the request is expired (409)."""
    chain = parse_requirement(row.requirement).stages()
    if not caller.roles & frozenset().union(*(quorum.required_roles(r) for r in chain)):
        return _refused(row, caller, decision, ReviewRefused(
            "you hold none of the roles this request needs", code="not_eligible"))
    ended: list[Event] = []
    if is_due(row, now):
        ended = await expire(conn, row, now, SYSTEM_ACTOR, settings=deps.settings)
        row = await load(conn, row.tenant, row.id, lock=False)
        if row.status == "expired":
            error, refused = _refused(row, caller, decision, ApprovalStateError(
                "the approval request has expired", code="approval_expired"))
            return error, ended + refused
    refusal, events = await _review_stage(deps, conn, caller, row, decision, comment, now,
                                          standing, assertion)
    return refusal, ended + events


async def _review_stage(deps: AppContext, conn: AsyncConnection, caller: Caller, row: Any,
                        decision: str, comment: str, now: datetime,
                        standing: dict[str, Any] | None, assertion: Any = None
                        ) -> tuple[CosignerError | None, list[Event]]:
    who = caller.actor()
    requirement = parse_requirement(row.requirement)
    held = caller.roles & quorum.required_roles(requirement)
    if not held:
        return _refused(row, caller, decision, ReviewRefused(
            "you hold none of the roles this request needs", code="not_eligible"))
    if row.status != "pending":
        code = "approval_expired" if row.status == "expired" else "approval_not_pending"
        return _refused(row, caller, decision, ApprovalStateError(
            f"the approval request is {row.status}", code=code))
    everyone = await reviews_of(conn, row.id)
    # Only this stage's reviews count toward its quorum; earlier stages' stay on record
    # (and one person still reviews a request once, whatever the stage).
    existing = [r for r in everyone if r.stage == stage_of(row)]
    ctx = review_rules.ReviewContext(
        requirement=requirement, initiator_id=str(row.initiator.get("id")),
        principal_id=str(row.principal.get("id")),
        opened_by=str(row.opened_by.get("subject")),
        previous_approvers=await _previous_approvers(conn, row),
        reviewed=frozenset(r.subject for r in everyone))
    # The signature first: a replayed or foreign assertion is named as such, whatever else
    # the rules would say of the review.
    try:
        held, signature = await review_signatures.judge(
            deps, conn, caller, row, requirement, held, decision=decision,
            assertion=assertion, now=now)
    except ReviewRefused as exc:
        return _refused(row, caller, decision, exc)
    signed = {"signature": signature} if signature is not None else {}
    refusal = review_rules.refusal_code(ctx, subject=caller.subject, roles=held,
                                        decision=decision)
    if refusal is not None:
        return _refused(row, caller, decision,
                        ReviewRefused(_REFUSAL_TEXT[refusal], code=refusal))
    short = stepup.shortfall(requirement, caller.authn,
                             provider=deps.settings.oidc.get(caller.tenant),
                             now_s=now.timestamp())
    if short is not None:
        wanted = stepup.asked(requirement)
        return _refused(row, caller, decision, ReviewRefused(
            short, code="step_up_required",
            step_up=wanted.as_dict() if wanted is not None else {}))
    grant: dict[str, Any] | None = None
    if standing is not None:
        try:
            if decision != "approved":
                raise InvalidRequest("only an approval can carry a standing approval",
                                     code="invalid_standing")
            grant = standing_rules.parse_grant(standing, requirement)
            standing_rules.check_grant(row, grant)
        except InvalidRequest as exc:
            return _refused(row, caller, decision, exc)
    if decision == "rejected":
        await _insert_review(conn, row, caller, held, None, decision, comment, now,
                             signature)
        await transition(conn, row, "rejected", now=now)
        await notify(conn, deps.settings, row, "approval.decided", now, status="rejected",
                      decided_by=[caller.subject])
        return None, [event("approval.reviewed", row, who, decision=decision, role=None,
                             comment=comment, authn=caller.authn.record(), **signed),
                      event("approval.rejected", row, who)]
    approving = [(r.subject, frozenset(r.roles)) for r in existing if r.decision == "approved"]
    assignment = quorum.match([*approving, (caller.subject, held)], requirement.require)
    if caller.subject not in assignment:
        return _refused(row, caller, decision, ReviewRefused(
            "the groups you could count for are already met", code="role_already_met"))
    await _insert_review(conn, row, caller, held, assignment[caller.subject], decision,
                         comment, now, signature)
    for earlier in existing:  # a new approver may shift who counts for which group
        if earlier.decision == "approved" and earlier.role != assignment.get(earlier.subject):
            await conn.execute(reviews.update().where(reviews.c.id == earlier.id)
                               .values(role=assignment.get(earlier.subject)))
    events = [event("approval.reviewed", row, who, decision=decision,
                     role=assignment[caller.subject], comment=comment,
                     progress=quorum.progress(requirement.require, assignment),
                     authn=caller.authn.record(), **signed)]
    if quorum.is_met(requirement.require, assignment):
        events += await _approve(deps, conn, row, assignment, now, who)
        if grant is not None:  # parse_grant: one person meets this stage, so it is met
            events.append(await standing_rules.grant(conn, row, caller, requirement, grant,
                                                     now))
    return None, events


_REFUSAL_TEXT = {
    "not_eligible": "you hold none of the roles this request needs",
    "self_approval": "the requester, initiator or principal cannot review this request",
    "previous_approver": "you already approved a call in this run",
    "duplicate_review": "you already reviewed this request",
}


async def _insert_review(conn: AsyncConnection, row: Any, caller: Caller, held: frozenset[str],
                         role: str | None, decision: str, comment: str,
                         now: datetime, signature: dict[str, Any] | None = None) -> None:
    await conn.execute(reviews.insert().values(
        id=new_id(), approval_id=row.id, tenant=row.tenant, run_id=row.run_id,
        subject=caller.subject, principal_id=caller.principal_id, roles=sorted(held),
        role=role, stage=stage_of(row), decision=decision, comment=comment, created_at=now,
        signature=signature))


async def _approve(deps: AppContext, conn: AsyncConnection, row: Any, assignment: dict[str, str],
                   now: datetime, who: dict[str, Any]) -> list[Event]:
    rows = await reviews_of(conn, row.id)
    approvers = [{"id": r.subject, "role": assignment[r.subject], "at": aware(r.created_at),
                  **_signed_ref(r)} for r in rows if r.subject in assignment]
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


def _signed_ref(review_row: Any) -> dict[str, Any]:
    ref = review_signatures.approver_signature(getattr(review_row, "signature", None))
    return {"signature": ref} if ref is not None else {}


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
            events = await expire(conn, row, now, SYSTEM_ACTOR, settings=deps.settings)
            row = await load(conn, caller.tenant, approval_id, lock=False)
        else:
            events = []
        if row.status == "expired":
            error = ApprovalStateError("the approval request has expired",
                                       code="approval_expired")
        elif row.status != "pending":
            raise ApprovalStateError(f"the approval request is {row.status}",
                                     code="approval_expired" if row.status == "expired"
                                     else "approval_not_pending")
        else:
            await transition(conn, row, "cancelled", now=now)
            await notify(conn, deps.settings, row, "approval.decided", now, status="cancelled",
                         decided_by=[caller.subject])
            events.append(event("approval.cancelled", row, who))
        await append(conn, caller.tenant, events, now=now)
        fresh = await load(conn, caller.tenant, approval_id, lock=False)
        state = view(fresh, await reviews_of(conn, approval_id),
                     public_url=deps.settings.public_url, now=now)
    if error is not None:
        raise error
    return state


