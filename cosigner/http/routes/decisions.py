"""Routes for the decision gate."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from cosigner.core.errors import InvalidRequest
from cosigner.decisions import pdp as decisions
from cosigner.http.body import openapi_body, strict_body
from cosigner.http.deps import PROBLEM_RESPONSES, CallerDep, context, json_response
from cosigner.http.models.decisions import DecisionRequestV1, DecisionV1

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
    caller.require("runtime")
    ctx = context(request)
    try:
        model, data = await strict_body(request, DecisionRequestV1,
                                        ctx.settings.max_body_bytes)
    except InvalidRequest as exc:
        await decisions.record_refusal(ctx, caller, code=exc.code, detail=exc.detail)
        raise
    req = decisions.DecisionRequest(
        request_id=model.request_id, run=data["run"], principal=data["principal"],
        initiator=data["initiator"], tool=data["tool"], args=data["args"],
        context=data.get("context", {}), raw=data, mode=model.mode)
    try:
        return json_response(await decisions.decide(ctx, caller, req))
    except InvalidRequest as exc:
        await decisions.record_refusal(ctx, caller, code=exc.code, detail=exc.detail,
                                       request_id=req.request_id, tool=req.tool["name"],
                                       run_id=req.run["id"])
        raise
