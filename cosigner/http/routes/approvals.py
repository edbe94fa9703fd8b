"""Routes for approval requests and reviews. Rules live in :mod:`cosigner.approvals.reviews`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Query, Request

from cosigner.approvals import opening as approval_requests
from cosigner.approvals import queries as approval_queries
from cosigner.approvals import rejections
from cosigner.approvals import reviews as approvals
from cosigner.http.body import openapi_body, strict_body
from cosigner.http.deps import PROBLEM_RESPONSES, CallerDep, context
from cosigner.http.models.approvals import (
    ID_PATTERN,
    ApprovalListV1,
    ApprovalStatus,
    ApprovalV1,
    ReviewAskV1,
    ReviewRequestV1,
    WithdrawRejectionV1,
)

router = APIRouter(prefix="/v1", tags=["approvals"])

_ID = Path(min_length=1, max_length=64, pattern=ID_PATTERN)
_RESPONSES = {**PROBLEM_RESPONSES, 404: PROBLEM_RESPONSES[409] | {"description": "Not found"}}


@router.post("/approvals", response_model=ApprovalV1, responses=_RESPONSES,
             openapi_extra=openapi_body(ReviewAskV1))
async def post_approval(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Ask for human review of an ``allow`` decision (runtime role).

    The decision's permit is revoked (withheld) and a ``runtime_review`` request opens with
    the active bundle's ``[review]`` requirement; a new permit is minted once approved.
    Asking again returns the same request. 404 unknown decision; 409 ``already_redeemed``;
    422 ``not_an_allow_decision`` or ``no_review_requirement``.
    """
    ctx = context(request)
    body, _ = await strict_body(request, ReviewAskV1, ctx.settings.max_body_bytes)
    await ctx.quotas.count_approval(caller)
    if ctx.webhook_backlog.full(caller.tenant):
        raise ctx.shedding.shed("webhooks", "the tenant's webhook backlog is full; no "
                                "approval request opens until it drains")
    return await approval_requests.request_review(ctx, caller, decision_id=body.decision_id,
                                          reason=body.reason)


@router.get("/approvals", response_model=ApprovalListV1, responses=_RESPONSES)
async def list_approvals(request: Request, caller: CallerDep,
                         status: ApprovalStatus = "pending",
                         limit: int = Query(100, ge=1, le=500)) -> dict[str, Any]:
    """Approval requests of the caller's tenant. For an approver with ``status=pending``:
    exactly those they may review now (their role, not their own, not yet reviewed)."""
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
    ``approval_not_pending``; 422 ``comment_required``, unknown fields.
    """
    ctx = context(request)
    body, _ = await strict_body(request, ReviewRequestV1, ctx.settings.max_body_bytes)
    return await approvals.review(ctx, caller, approval_id, decision=body.decision,
                                  comment=body.comment)


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
