"""Break-glass: one ``breakglass`` principal authorises a pending request alone, in an
emergency, and an approver reviews it afterwards.

Only a *pending* request can be broken open, so a call the policy denies never can (there
is no request then; a standing rejection denies before any request opens). The policy may
forbid it per requirement (``break_glass: false``). The rules of a review still apply to
who may do it: never the requesting side of the call (the runtime that opened it, the
initiator, the principal: case K13), whatever ``distinct_from`` says. The reason must have
at least ``break_glass_min_reason_chars`` characters.

It mints the permit at once, flagged ``break_glass`` (claim), moves the request to
``approved`` with ``break_glass {by, reason, at}``, queues the webhook
``approval.break_glass`` naming every role of the requirement (all its stages), and opens
the mandatory after-the-fact review: ``after_review = "open"`` until an approver holding one
of the request's roles records it (:func:`record_after_review`); open ones are listed with
``GET /v1/approvals?status=after_review``. Every attempt, refused or not, is an event
committed with the change (``approval.break_glass``, ``approval.break_glass_refused``,
``approval.after_reviewed``, ``approval.after_review_refused``).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.approvals.requests import (
    SYSTEM_ACTOR,
    aware,
    event,
    expire,
    is_due,
    load,
    reviews_of,
    transition,
)
from cosigner.approvals.views import display_args, view
from cosigner.audit.chain import Event, append
from cosigner.core.clock import isoformat
from cosigner.core.errors import (
    ApprovalStateError,
    CosignerError,
    Forbidden,
    InvalidRequest,
    NotFound,
    ReviewRefused,
)
from cosigner.core.roles import BREAKGLASS_ROLE
from cosigner.core.subjects import subject_key
from cosigner.db.tables_approvals import approvals
from cosigner.identity.principals import Caller
from cosigner.permits import ledger as permit_ledger
from cosigner.policy.result import parse_requirement

if TYPE_CHECKING:
    from cosigner.context import AppContext

__all__ = ["MAX_REASON_CHARS", "VERDICTS", "break_glass", "record_after_review"]

MAX_REASON_CHARS = 2000
VERDICTS = ("upheld", "objected")


def _requesting_side(row: Any) -> set[str]:
    return {subject_key(str(row.opened_by.get("subject"))),
            subject_key(str(row.initiator.get("id"))),
            subject_key(str(row.principal.get("id")))}


def _chain_roles(row: Any) -> list[str]:
    """Every role the request's requirement names, over all its (remaining) stages."""
    roles: list[str] = []
    for stage in parse_requirement(row.requirement).stages():
        roles += [g.role for g in stage.require if g.role not in roles]
    return roles


async def break_glass(deps: AppContext, caller: Caller, approval_id: str, *,
                      reason: str) -> dict[str, Any]:
    """Authorise a pending request as ``caller`` alone (``breakglass`` role of its tenant).

    Returns the approval state, with the permit (flagged ``break_glass``).

    Raises:
        Forbidden: the caller lacks the ``breakglass`` role (logged).
        InvalidRequest: ``reason_too_short`` (fewer than ``break_glass_min_reason_chars``
            characters after trimming), ``reason_too_long``.
        NotFound: no such request in the caller's tenant.
        ReviewRefused: ``self_approval`` (the requesting side), ``break_glass_forbidden``
            (the policy forbids it for this requirement).
        ApprovalStateError: ``approval_expired``, ``approval_not_pending``.
    """
    text = reason.strip()
    minimum = deps.settings.break_glass_min_reason_chars
    if len(text) < minimum:
        raise InvalidRequest(f"a break-glass reason needs at least {minimum} characters",
                             code="reason_too_short")
    if len(text) > MAX_REASON_CHARS:
        raise InvalidRequest(f"reason longer than {MAX_REASON_CHARS} characters",
                             code="reason_too_long")
    now = deps.clock()
    who = caller.actor()
    refusal: CosignerError | None = None
    state: dict[str, Any] = {}
    async with deps.db.transaction() as conn:
        row = await load(conn, caller.tenant, approval_id, lock=True)
        if row is None:
            refusal = NotFound("no such approval request")
            events = [Event(type="approval.break_glass_refused", actor=who,
                            payload={"code": "not_found"})]
        else:
            refusal, events = await _break_locked(deps, conn, caller, row, text, now)
            state = view(await load(conn, caller.tenant, approval_id, lock=False),
                         await reviews_of(conn, approval_id),
                         public_url=deps.settings.public_url, now=now, include_permit=True)
        await append(conn, caller.tenant, events, now=now)
    if refusal is not None:
        raise refusal
    return state


async def _break_locked(deps: AppContext, conn: AsyncConnection, caller: Caller, row: Any,
                        reason: str, now: datetime
                        ) -> tuple[CosignerError | None, list[Event]]:
    who = caller.actor()

    def refused(error: CosignerError, earlier: list[Event] | None = None
                ) -> tuple[CosignerError, list[Event]]:
        return error, [*(earlier or []),
                       event("approval.break_glass_refused", row, who, code=error.code)]

    if not caller.has_any(BREAKGLASS_ROLE):
        return refused(Forbidden("requires the breakglass role"))
    ended: list[Event] = []
    if is_due(row, now):  # expiry wins; an escalated request is still pending
        ended = await expire(conn, row, now, SYSTEM_ACTOR, settings=deps.settings)
        row = await load(conn, row.tenant, row.id, lock=False)
    if row.status != "pending":
        code = "approval_expired" if row.status == "expired" else "approval_not_pending"
        return refused(ApprovalStateError(f"the approval request is {row.status}",
                                          code=code), ended)
    if subject_key(caller.subject) in _requesting_side(row):
        return refused(ReviewRefused("the requester, initiator or principal cannot "
                                     "authorise their own call", code="self_approval"), ended)
    if not parse_requirement(row.requirement).break_glass:
        return refused(ReviewRefused("the policy forbids break-glass for this call",
                                     code="break_glass_forbidden"), ended)
    remaining = int((aware(row.expires_at) - now).total_seconds())
    ttl = max(1, min(remaining, deps.settings.max_permit_ttl_s,
                     deps.keyring.max_token_lifetime_s))
    permit, minted = await permit_ledger.issue(
        conn, deps.keyring, deps.settings, tenant=row.tenant, run_id=row.run_id,
        decision_id=row.decision_id, approval_id=row.id, tool=row.tool,
        args_hash=row.args_hash, policy=row.policy or {},
        approvers=[{"id": caller.subject, "role": BREAKGLASS_ROLE, "at": now}], now=now,
        ttl_s=ttl, actor=who, break_glass=True)
    record = {"by": who, "reason": reason, "at": isoformat(now)}
    if not await transition(conn, row, "approved", now=now, permit_jti=permit["jti"],
                            permit=permit, break_glass=record, after_review="open"):
        raise ApprovalStateError("the approval request changed state",
                                 code="approval_not_pending")
    roles = _chain_roles(row)
    await _notify(deps, conn, row, record, roles, now)
    return None, [*ended, event("approval.break_glass", row, who, reason=reason,
                                notified_roles=roles, after_review="open"), minted]


async def _notify(deps: AppContext, conn: AsyncConnection, row: Any, record: dict[str, Any],
                  roles: list[str], now: datetime) -> None:
    """Webhook ``approval.break_glass`` to every receiver of the tenant, at once, naming
    the roles whose approvers must know (masked args only)."""
    from cosigner.webhooks import outbox

    if not outbox.targets(deps.settings, row.tenant):
        return
    await outbox.enqueue(conn, deps.settings, tenant=row.tenant,
                         event_type="approval.break_glass", now=now, approval={
                             "id": row.id, "tool": row.tool,
                             "args": display_args(row.args, row.mask),
                             "args_hash": row.args_hash, "status": "approved",
                             "expires_at": aware(row.expires_at).isoformat(),
                             "decided_by": [record["by"]["subject"]],
                             "break_glass": {"by": record["by"]["subject"],
                                             "reason": record["reason"], "at": record["at"]},
                             "notify_roles": roles, "after_review": "open"})


async def record_after_review(deps: AppContext, caller: Caller, approval_id: str, *,
                              verdict: str, comment: str) -> dict[str, Any]:
    """Close the mandatory review of a break-glass authorisation (``verdict``: ``upheld``
    or ``objected``, with a comment). Who: an approver holding one of the request's roles
    (any stage), never the break-glass principal nor the requesting side.

    Raises:
        InvalidRequest: ``invalid_verdict``, ``comment_required``.
        NotFound: no such request in the caller's tenant.
        ReviewRefused: ``not_eligible``, ``self_approval``.
        ApprovalStateError: ``no_after_review`` (not broken open, or already reviewed).
    """
    if verdict not in VERDICTS:
        raise InvalidRequest("verdict must be upheld or objected", code="invalid_verdict")
    if not comment.strip():
        raise InvalidRequest("an after-the-fact review needs a comment",
                             code="comment_required")
    now = deps.clock()
    who = caller.actor()
    refusal: CosignerError | None = None
    async with deps.db.transaction() as conn:
        row = await load(conn, caller.tenant, approval_id, lock=True)
        if row is None:
            raise NotFound("no such approval request")
        refusal = _after_review_refusal(caller, row)
        if refusal is not None:
            events = [event("approval.after_review_refused", row, who, code=refusal.code)]
        else:
            record = {"by": who, "verdict": verdict, "comment": comment[:MAX_REASON_CHARS],
                      "at": isoformat(now)}
            done = await conn.execute(approvals.update().where(
                approvals.c.id == row.id, approvals.c.after_review == "open")
                .values(after_review="done", after_reviewed=record))
            if done.rowcount != 1:
                raise ApprovalStateError("already reviewed", code="no_after_review")
            events = [event("approval.after_reviewed", row, who, verdict=verdict,
                            comment=record["comment"])]
        await append(conn, caller.tenant, events, now=now)
        state = view(await load(conn, caller.tenant, approval_id, lock=False),
                     await reviews_of(conn, approval_id),
                     public_url=deps.settings.public_url, now=now)
    if refusal is not None:
        raise refusal
    return state


def _after_review_refusal(caller: Caller, row: Any) -> CosignerError | None:
    if not caller.roles & frozenset(_chain_roles(row)):
        return ReviewRefused("you hold none of the roles this request needs",
                             code="not_eligible")
    me = subject_key(caller.subject)
    broke = row.break_glass or {}
    if me in _requesting_side(row) or me == subject_key(
            str(broke.get("by", {}).get("subject"))):
        return ReviewRefused("the requesting side and the break-glass principal cannot "
                             "review it", code="self_approval")
    if row.after_review != "open":
        return ApprovalStateError("no open after-the-fact review on this request",
                                  code="no_after_review")
    return None

