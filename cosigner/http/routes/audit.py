"""Routes for auditors: query the decision log, its checkpoints, and stream exports.

Every route needs the ``auditor`` role; the tenant is the caller's (invariant 7).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from cosigner.audit import export as audit_export
from cosigner.audit.checkpoints import checkpoint_now
from cosigner.audit.query import (
    EventFilter,
    decode_cursor,
    encode_cursor,
    query_checkpoints,
    query_events,
)
from cosigner.http.deps import PROBLEM_RESPONSES, CallerDep, context
from cosigner.http.models.audit import (
    AuditEventPageV1,
    CheckpointPageV1,
    CheckpointResultV1,
)

router = APIRouter(prefix="/v1/audit", tags=["audit"])

Limit = Annotated[int, Query(ge=1, le=1000, description="Page size, 1..1000.")]
Since = Annotated[datetime | None, Query(description="Inclusive lower bound (RFC 3339).")]
Until = Annotated[datetime | None, Query(description="Exclusive upper bound (RFC 3339).")]


@router.get("/events", response_model=AuditEventPageV1, responses=PROBLEM_RESPONSES)
async def list_events(
    request: Request, caller: CallerDep, since: Since = None, until: Until = None,
    type: str | None = None, tool: str | None = None, effect: str | None = None,
    run_id: str | None = None, principal: str | None = None,
    decision_id: str | None = None, approval_id: str | None = None,
    policy_id: str | None = None, policy_version: str | None = None,
    mode: Annotated[Literal["shadow"] | None, Query(
        description="shadow: only shadow-mode decisions (recorded, never enforced)")] = None,
    cursor: str | None = None, limit: Limit = 100,
) -> dict[str, Any]:
    """Events of the caller's tenant in ``seq`` order, filtered (auditor role).

    Errors: 403 without the auditor role; 422 bad filter, cursor or limit.
    """
    caller.require("auditor")
    where = EventFilter(since=since, until=until, type=type, tool=tool, effect=effect,
                        run_id=run_id, principal=principal, decision_id=decision_id,
                        approval_id=approval_id, policy_id=policy_id,
                        policy_version=policy_version, mode=mode)
    async with context(request).db.read(bulk=True) as conn:
        events, next_cursor = await query_events(conn, tenant=caller.tenant, where=where,
                                                 cursor=cursor, limit=limit)
    return {"events": events, "next_cursor": next_cursor}


@router.get("/checkpoints", response_model=CheckpointPageV1, responses=PROBLEM_RESPONSES)
async def list_checkpoints(request: Request, caller: CallerDep, cursor: str | None = None,
                           limit: Limit = 100) -> dict[str, Any]:
    """Signed checkpoints of the caller's tenant, oldest first (auditor role)."""
    caller.require("auditor")
    after = decode_cursor(cursor) if cursor else 0
    async with context(request).db.read(bulk=True) as conn:
        found = await query_checkpoints(conn, tenant=caller.tenant, after_seq=after,
                                        limit=limit + 1)
    page = found[:limit]
    return {"checkpoints": [c.as_dict() for c in page],
            "next_cursor": encode_cursor(page[-1].seq) if len(found) > limit else None}


@router.post("/checkpoints", response_model=CheckpointResultV1, responses=PROBLEM_RESPONSES)
async def create_checkpoint(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Sign the tenant's current head now (auditor role); returns the checkpoint at the head.

    Signing changes no event: it only fixes what the log holds at this moment.
    """
    caller.require("auditor")
    deps = context(request)
    checkpoint = await checkpoint_now(deps.db, deps.keyring, tenant=caller.tenant,
                                      now=deps.clock())
    return {"checkpoint": checkpoint.as_dict() if checkpoint else None}


@router.get("/export", responses={**PROBLEM_RESPONSES, 200: {
    "description": "JSON Lines (application/x-ndjson) or CSV (text/csv), streamed.",
    "content": {"application/x-ndjson": {}, "text/csv": {}}}})
async def export_log(request: Request, caller: CallerDep,
                     format: Literal["jsonl", "csv"] = "jsonl", since: Since = None,
                     until: Until = None) -> StreamingResponse:
    """Stream the tenant's decision log with the checkpoints that verify it (auditor role).

    The range is widened to signed anchors so it verifies on its own
    (``cosigner audit verify``); without ``until`` the current head is signed first.
    """
    caller.require("auditor")
    deps = context(request)
    chunks = await audit_export.export(deps.db, deps.keyring, tenant=caller.tenant,
                                       fmt=format, since=since, until=until, now=deps.clock())
    media = "application/x-ndjson" if format == "jsonl" else "text/csv"
    name = f"cosigner-audit-{caller.tenant}.{format}"
    return StreamingResponse(chunks, media_type=media, headers={
        "Content-Disposition": f'attachment; filename="{name}"'})
