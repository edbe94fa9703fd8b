"""Routes for the decision gate.

``POST /v1/decisions`` is served by the lean ASGI path (:mod:`cosigner.http.lean`); the
FastAPI route below documents it in OpenAPI and serves it only where the lean path steps
aside (a ``root_path`` mount). Both run :func:`decide_body`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response

from cosigner.context import AppContext
from cosigner.core.canonical import parse_json
from cosigner.core.errors import InvalidRequest
from cosigner.decisions import pdp as decisions
from cosigner.http.body import openapi_body, read_body, validate
from cosigner.http.deps import PROBLEM_RESPONSES, CallerDep, context, json_response
from cosigner.http.models.decisions import DecisionRequestV1, DecisionV1
from cosigner.http.models.shapes import decision_request_fits
from cosigner.identity.principals import Caller

router = APIRouter(prefix="/v1", tags=["decisions"])


@router.post("/decisions", response_model=DecisionV1, responses=PROBLEM_RESPONSES,
             openapi_extra=openapi_body(DecisionRequestV1))
async def post_decision(request: Request, caller: CallerDep) -> Response:
    """Decide whether a proposed tool call may run (runtime role).

    Returns ``allow`` (with a permit), ``deny``, or ``require_approval`` (with the
    approval request). Errors: 400/422 malformed or unhashable body, unknown fields,
    arguments failing the tool schema; 409 ``request_id`` reused with other content;
    429 ``rate_limited`` (a limit or quota is used up; ``Retry-After``); 503 the decision
    could not be recorded or ``overloaded`` (``Retry-After``; treat as deny).
    """
    ctx = context(request)
    return json_response(await decide_body(
        ctx, caller, lambda: read_body(request, ctx.settings.max_body_bytes)))


async def decide_body(ctx: AppContext, caller: Caller,
                      read: Callable[[], Awaitable[bytes]]) -> dict[str, Any]:
    """The decision of an authenticated caller's request body (``read()`` returns the raw
    bytes, raising PayloadTooLarge past the limit): the documented ``DecisionV1`` object.

    Raises:
        Forbidden: the caller lacks the runtime role (403).
        InvalidRequest: body too large (413), not strict JSON (400/422), not the schema
            (422) — each recorded as a refusal in the decision log first.
        CosignerError: as :func:`cosigner.decisions.pdp.decide`.
    """
    caller.require("runtime")
    try:
        data = parse_json(await read())
        if not decision_request_fits(data):  # pydantic decides (and words the errors)
            validate(DecisionRequestV1, data)
    except InvalidRequest as exc:
        await decisions.record_refusal(ctx, caller, code=exc.code, detail=exc.detail)
        raise
    # Validated strictly (nothing converted): the model's values are the body's own.
    req = decisions.DecisionRequest(
        request_id=data["request_id"], run=data["run"], principal=data["principal"],
        initiator=data["initiator"], tool=data["tool"], args=data["args"],
        context=data.get("context", {}), raw=data, mode=data.get("mode", "on"))
    try:
        return await decisions.decide(ctx, caller, req)
    except InvalidRequest as exc:
        await decisions.record_refusal(ctx, caller, code=exc.code, detail=exc.detail,
                                       request_id=req.request_id, tool=req.tool["name"],
                                       run_id=req.run["id"])
        raise
