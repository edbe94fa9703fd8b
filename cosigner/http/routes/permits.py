"""Routes for redeeming and revoking permits. Checks live in :mod:`cosigner.permits.redeem`
and :mod:`cosigner.permits.ledger`. ``POST /v1/permits/redeem`` is served by the lean ASGI
path (:mod:`cosigner.http.lean`); its FastAPI route documents it and is the fallback."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Path, Request, Response

from cosigner.context import AppContext
from cosigner.core.canonical import parse_json
from cosigner.http.body import openapi_body, read_body, validate
from cosigner.http.deps import PROBLEM_RESPONSES, CallerDep, context, json_response
from cosigner.http.models.approvals import (
    ID_PATTERN,
    PermitRevocationV1,
    RedeemRequestV1,
    RedemptionV1,
)
from cosigner.http.models.shapes import redeem_request_fits
from cosigner.identity.principals import Caller
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
    return json_response(await redeem_body(
        ctx, caller, lambda: read_body(request, ctx.settings.max_body_bytes)))


async def redeem_body(ctx: AppContext, caller: Caller,
                      read: Callable[[], Awaitable[bytes]]) -> dict[str, Any]:
    """The redemption of an authenticated caller's request body (``read()`` returns the
    raw bytes): the documented ``RedemptionV1`` object. Shared by the FastAPI route and
    the lean path (:mod:`cosigner.http.lean`).

    Raises:
        Forbidden: the caller lacks the runtime role (403).
        InvalidRequest: body too large (413), not strict JSON (400/422), not the schema.
        PermitRefused: as :func:`cosigner.permits.redeem.redeem`.
    """
    caller.require("runtime")
    data = parse_json(await read())
    if not redeem_request_fits(data):  # pydantic decides (and words the errors)
        validate(RedeemRequestV1, data)
    return await permit_redeem.redeem(
        ctx, caller, token=data["permit"], tool=data["tool"], args=data["args"])


@router.post("/permits/{jti}/revoke", response_model=PermitRevocationV1,
             responses=PROBLEM_RESPONSES)
async def post_revoke(request: Request, caller: CallerDep, jti: str = Path(
        min_length=1, max_length=64, pattern=ID_PATTERN)) -> dict[str, Any]:
    """Revoke an unredeemed permit (admin, or an approver of the tenant).
    404 unknown here; 409 ``already_redeemed``."""
    return await permit_ledger.revoke(context(request), caller, jti)
