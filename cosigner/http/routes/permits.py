"""Routes for redeeming and revoking permits. Checks live in :mod:`cosigner.permits.redeem`
and :mod:`cosigner.permits.ledger`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Request, Response

from cosigner.http.body import openapi_body, strict_body
from cosigner.http.deps import PROBLEM_RESPONSES, CallerDep, context, json_response
from cosigner.http.models.approvals import (
    ID_PATTERN,
    PermitRevocationV1,
    RedeemRequestV1,
    RedemptionV1,
)
from cosigner.permits import ledger as permit_ledger
from cosigner.permits import redeem as permit_redeem

router = APIRouter(prefix="/v1", tags=["permits"])


@router.post("/permits/redeem", response_model=RedemptionV1, responses=PROBLEM_RESPONSES,
             openapi_extra=openapi_body(RedeemRequestV1))
async def post_redeem(request: Request, caller: CallerDep) -> Response:
    """Redeem a permit right before executing the call (runtime role; single use).

    403 ``bad_signature``, ``malformed_permit``, ``unknown_kid``, ``wrong_token_type``,
    ``wrong_audience``, ``tenant_mismatch``, ``tool_mismatch``, ``args_mismatch``,
    ``unknown_permit``, ``invalid_args`` (args fail the tool schema); 409
    ``already_redeemed``, ``revoked``, ``expired``, ``not_yet_valid``, ``policy_changed``;
    422 unhashable args or unknown fields.
    """
    ctx = context(request)
    caller.require("runtime")
    _, data = await strict_body(request, RedeemRequestV1, ctx.settings.max_body_bytes)
    return json_response(await permit_redeem.redeem(
        ctx, caller, token=data["permit"], tool=data["tool"], args=data["args"]))


@router.post("/permits/{jti}/revoke", response_model=PermitRevocationV1,
             responses=PROBLEM_RESPONSES)
async def post_revoke(request: Request, caller: CallerDep, jti: str = Path(
        min_length=1, max_length=64, pattern=ID_PATTERN)) -> dict[str, Any]:
    """Revoke an unredeemed permit (admin, or an approver of the tenant).
    404 unknown here; 409 ``already_redeemed``."""
    return await permit_ledger.revoke(context(request), caller, jti)
