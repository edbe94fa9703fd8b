"""Routes for approval requests and reviews. Rules live in :mod:`cosigner.approvals.reviews`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Query, Request

from cosigner.approvals import barriers, breakglass, rejections
from cosigner.approvals import opening as approval_requests
from cosigner.approvals import queries as approval_queries
from cosigner.approvals import reviews as approvals
from cosigner.approvals import standing as standing_approvals
from cosigner.core.canonical import parse_json
from cosigner.http.body import openapi_body, read_body, strict_body, validate
from cosigner.http.deps import PROBLEM_RESPONSES, CallerDep, context
from cosigner.http.models.approvals import (
    ID_PATTERN,
    AfterReviewRequestV1,
    ApprovalFilter,
    ApprovalListV1,
    ApprovalV1,
    BarrierAskV1,
    BreakGlassRequestV1,
    ReviewAskV1,
    ReviewRequestV1,
    StandingApprovalListV1,
    StandingApprovalV1,
    WithdrawRejectionV1,
)

router = APIRouter(prefix="/v1", tags=["approvals"])

_ID = Path(min_length=1, max_length=64, pattern=ID_PATTERN)
_RESPONSES = {**PROBLEM_RESPONSES, 404: PROBLEM_RESPONSES[409] | {"description": "Not found"}}


@router.post("/approvals", response_model=ApprovalV1, responses=_RESPONSES,
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": {"oneOf": [
                     {"$ref": "#/components/schemas/ReviewAskV1"},
                     {"$ref": "#/components/schemas/BarrierAskV1"}]}}}}})
async def post_approval(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Open an approval request, in one of two forms.

    ``{decision_id, reason}`` (runtime role): human review of an ``allow`` decision. The
    decision's permit is revoked (withheld) and a ``runtime_review`` request opens with
    the active bundle's ``[review]`` requirement; a new permit is minted once approved.
    Asking again returns the same request (once superseded, the request that replaced
    it: ``superseded_by``). 404 unknown decision; 409 ``already_redeemed``;
    422 ``not_an_allow_decision``, ``shadow_decision`` or ``no_review_requirement``.

    ``{run, context, require, timeout_ms, distinct_from}`` (role ``barrier``): a program
    barrier over ``context``; the policy may raise the requirement, never lower it. 403
    ``forbidden`` without the role, ``barrier_denied`` when the policy denies it; 422
    ``invalid_requirement``. See :mod:`cosigner.approvals.barriers`.
    """
    ctx = context(request)
    data = parse_json(await read_body(request, ctx.settings.max_body_bytes))
    await ctx.quotas.count_approval(caller)
    if ctx.webhook_backlog.full(caller.tenant):
        raise ctx.shedding.shed("webhooks", "the tenant's webhook backlog is full; no "
                                "approval request opens until it drains")
    if isinstance(data, dict) and "decision_id" in data:
        ask = validate(ReviewAskV1, data)
        return await approval_requests.request_review(ctx, caller,
                                                      decision_id=ask.decision_id,
                                                      reason=ask.reason)
    barrier = validate(BarrierAskV1, data)
    return await barriers.open_barrier(
        ctx, caller, run=data["run"], context=data["context"],
        requirement={"require": [g.model_dump() for g in barrier.require],
                     "timeout_ms": barrier.timeout_ms,
                     "distinct_from": barrier.distinct_from},
        principal=barrier.principal.model_dump() if barrier.principal else None,
        initiator=barrier.initiator.model_dump() if barrier.initiator else None)


@router.get("/approvals", response_model=ApprovalListV1, responses=_RESPONSES)
async def list_approvals(request: Request, caller: CallerDep,
                         status: ApprovalFilter = "pending",
                         limit: int = Query(100, ge=1, le=500)) -> dict[str, Any]:
    """Approval requests of the caller's tenant. For an approver with ``status=pending``:
    exactly those they may review now (their role, not their own, not yet reviewed).
    ``status=after_review``: break-glass authorisations still awaiting their review."""
    items = await approval_queries.list_requests(context(request), caller,
                                                 status=status, limit=limit)
    return {"items": items}


@router.get("/approvals/{approval_id}", response_model=ApprovalV1, responses=_RESPONSES)
async def get_approval(request: Request, caller: CallerDep, approval_id: str = _ID,
                       wait: float = Query(0, ge=0, le=60,
                                           description="Long-poll up to this many seconds "
                                                       "while pending.")) -> dict[str, Any]:
    """An approval request's state; with ``wait`` answer as soon as it leaves ``pending``
    (or after ``wait`` s with ``retry_after``). The permit is included once approved, for
    runtime callers. 404 unknown here (other tenants' ids included)."""
    return await approval_queries.get_state(context(request), caller, approval_id,
                                            wait_s=wait)


@router.post("/approvals/{approval_id}/reviews", response_model=ApprovalV1,
             responses=_RESPONSES, openapi_extra=openapi_body(ReviewRequestV1))
async def post_review(request: Request, caller: CallerDep,
                      approval_id: str = _ID) -> dict[str, Any]:
    """Approve or reject as the authenticated approver (identity from the credential only).

    403 ``not_eligible``, ``self_approval``, ``previous_approver``; 409 ``duplicate_review``,
    ``role_already_met``, ``approval_expired`` (at or after ``expires_at``),
    ``approval_not_pending``; 422 ``comment_required``, unknown fields, and for a
    ``standing`` grant ``standing_not_allowed``, ``standing_needs_one_approver``,
    ``standing_masked_path``, ``standing_mismatch``, ``invalid_standing``; 409
    ``signature_required`` when the request asks for approvals signed with the approver's
    own passkey (README § Signed approvals): an API key never satisfies that.
    """
    ctx = context(request)
    body, data = await strict_body(request, ReviewRequestV1, ctx.settings.max_body_bytes)
    # The grant as sent (the wire model checked its shape), never a re-dumped model.
    standing = data.get("standing") if body.standing is not None else None
    return await approvals.review(ctx, caller, approval_id, decision=body.decision,
                                  comment=body.comment, standing=standing)


@router.post("/approvals/{approval_id}/cancel", response_model=ApprovalV1,
             responses=_RESPONSES)
async def post_cancel(request: Request, caller: CallerDep,
                      approval_id: str = _ID) -> dict[str, Any]:
    """Cancel a pending request (runtime role of its tenant). 409 when not pending."""
    return await approvals.cancel(context(request), caller, approval_id)


@router.post("/approvals/{approval_id}/withdraw-rejection", response_model=ApprovalV1,
             responses=_RESPONSES, openapi_extra=openapi_body(WithdrawRejectionV1))
async def post_withdraw_rejection(request: Request, caller: CallerDep,
                                  approval_id: str = _ID) -> dict[str, Any]:
    """Withdraw a rejection (an admin, or an approver holding a required role; never the
    requesting side): the same call in the run is no longer denied
    ``rejected_by_reviewer``. Logged with the actor and ``reason``.

    403 ``not_eligible``, ``self_approval``; 409 ``not_rejected``, ``rejection_withdrawn``.
    """
    ctx = context(request)
    body, _ = await strict_body(request, WithdrawRejectionV1, ctx.settings.max_body_bytes)
    return await rejections.withdraw(ctx, caller, approval_id, reason_text=body.reason)


@router.post("/approvals/{approval_id}/break-glass", response_model=ApprovalV1,
             responses=_RESPONSES, openapi_extra=openapi_body(BreakGlassRequestV1))
async def post_break_glass(request: Request, caller: CallerDep,
                           approval_id: str = _ID) -> dict[str, Any]:
    """Authorise a pending request alone (``breakglass`` role; identity from the
    credential): mints a permit flagged ``break_glass``, notifies every approver role at
    once (webhook ``approval.break_glass``) and opens the mandatory after-the-fact review.

    403 ``forbidden`` (no breakglass role), ``self_approval``, ``break_glass_forbidden``
    (the policy forbids it); 409 ``approval_expired``, ``approval_not_pending``; 422
    ``reason_too_short``.
    """
    ctx = context(request)
    body, _ = await strict_body(request, BreakGlassRequestV1, ctx.settings.max_body_bytes)
    return await breakglass.break_glass(ctx, caller, approval_id, reason=body.reason)


@router.post("/approvals/{approval_id}/after-review", response_model=ApprovalV1,
             responses=_RESPONSES, openapi_extra=openapi_body(AfterReviewRequestV1))
async def post_after_review(request: Request, caller: CallerDep,
                            approval_id: str = _ID) -> dict[str, Any]:
    """Record the after-the-fact review of a break-glass authorisation (an approver
    holding one of the request's roles; never the break-glass principal or the requesting
    side). 403 ``not_eligible``, ``self_approval``; 409 ``no_after_review``.
    """
    ctx = context(request)
    body, _ = await strict_body(request, AfterReviewRequestV1, ctx.settings.max_body_bytes)
    return await breakglass.record_after_review(ctx, caller, approval_id,
                                                verdict=body.verdict, comment=body.comment)


@router.get("/standing-approvals", response_model=StandingApprovalListV1,
            responses=_RESPONSES)
async def list_standing(request: Request, caller: CallerDep,
                        active: bool = Query(True, description="Only those still usable."),
                        limit: int = Query(100, ge=1, le=500)) -> dict[str, Any]:
    """Standing approvals of the caller's tenant (approvers: those of their roles)."""
    items = await standing_approvals.list_standing(context(request), caller,
                                                   active_only=active, limit=limit)
    return {"items": items}


@router.post("/standing-approvals/{standing_id}/revoke", response_model=StandingApprovalV1,
             responses=_RESPONSES)
async def post_revoke_standing(request: Request, caller: CallerDep,
                               standing_id: str = Path(min_length=1, max_length=64,
                                                       pattern=ID_PATTERN)) -> dict[str, Any]:
    """Revoke a standing approval (an admin, or an approver holding one of its roles): no
    later call uses it and its unredeemed permits no longer redeem. 403 ``not_eligible``."""
    return await standing_approvals.revoke(context(request), caller, standing_id)
