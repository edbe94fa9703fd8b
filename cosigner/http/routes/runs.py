"""Routes for run contracts, outcome reports and permit state (runtime role)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse

from cosigner.http.body import openapi_body, strict_body
from cosigner.http.deps import PROBLEM_RESPONSES, CallerDep, context
from cosigner.http.models.runs import (
    OutcomeReportV1,
    OutcomeV1,
    PermitStateV1,
    RunContractV1,
    RunV1,
)
from cosigner.permits import status as permit_status
from cosigner.runs import contracts, outcomes

router = APIRouter(prefix="/v1", tags=["runs"])

_RUN_ID = Path(min_length=1, max_length=256)


@router.post("/runs", response_model=RunV1, status_code=201, responses={
    200: {"description": "The identical contract was already registered", "model": RunV1},
    **PROBLEM_RESPONSES}, openapi_extra=openapi_body(RunContractV1))
async def post_run(request: Request, caller: CallerDep) -> Any:
    """Register a run contract (runtime role; tenant from the key).

    201 with the Run on first registration, 200 when the identical contract exists;
    409 ``contract_conflict`` when another contract exists (contracts never widen);
    422 for an invalid contract.
    """
    caller.require("runtime")
    ctx = context(request)
    _, data = await strict_body(request, RunContractV1, ctx.settings.max_body_bytes)
    run, created = await contracts.register_contract(
        ctx.db, caller, data, now=ctx.clock(), known=ctx.contracted_runs)
    return JSONResponse(run, status_code=201 if created else 200)


@router.get("/runs/{run_id}", response_model=RunV1, responses=PROBLEM_RESPONSES)
async def get_run(request: Request, caller: CallerDep,
                  run_id: str = _RUN_ID) -> dict[str, Any]:
    """A run's contract and live counters (runtime or auditor; 404 if none here)."""
    caller.require("runtime", "auditor")
    return await contracts.get_run(context(request).db, caller, run_id)


@router.post("/decisions/{decision_id}/outcome", response_model=OutcomeV1,
             responses=PROBLEM_RESPONSES, openapi_extra=openapi_body(OutcomeReportV1))
async def post_outcome(request: Request, caller: CallerDep,
                       decision_id: str = Path(max_length=36)) -> dict[str, Any]:
    """Report what happened after a decision (runtime role of the decision's tenant).

    Records an ``outcome.reported`` event and counts ``cost_minor`` against the run.
    404 unknown decision; 409 ``outcome_conflict`` when a different report exists.
    """
    caller.require("runtime")
    ctx = context(request)
    model, _ = await strict_body(request, OutcomeReportV1, ctx.settings.max_body_bytes)
    return await outcomes.report_outcome(
        ctx.db, caller, decision_id=decision_id, outcome=model.outcome,
        side_effect=model.side_effect, cost_minor=model.cost_minor, now=ctx.clock())


@router.get("/permits/{jti}", response_model=PermitStateV1, responses=PROBLEM_RESPONSES)
async def get_permit(request: Request, caller: CallerDep,
                     jti: str = Path(min_length=1, max_length=64)) -> dict[str, Any]:
    """A permit's state (runtime or auditor of its tenant; 404 otherwise).

    Lets a client whose redeem response was lost learn whether the redeem happened
    (and was its own) before retrying; see ``cosigner.permits.status``. A redeemed
    permit whose redeem event no longer reads back from the decision log (damaged or
    deleted rows) is answered 500 ``audit_event_unreadable``: do not execute.
    """
    caller.require("runtime", "auditor")
    ctx = context(request)
    return await permit_status.permit_status(ctx.db, caller, jti, now=ctx.clock())

