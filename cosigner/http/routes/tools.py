"""Route for the tool catalogue a runtime sees (runtime role)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel

from cosigner.http.deps import PROBLEM_RESPONSES, CallerDep, context
from cosigner.http.models.decisions import PolicyRefV1
from cosigner.policy.catalogue import describe_tools

router = APIRouter(prefix="/v1", tags=["decisions"])


class ToolEntryV1(BaseModel):
    name: str
    side_effect: Literal["none", "read", "write", "financial", "destructive"]


class ToolCatalogueV1(BaseModel):
    policy: PolicyRefV1 | None
    tools: list[ToolEntryV1] | None


@router.get("/tools", response_model=ToolCatalogueV1, responses=PROBLEM_RESPONSES)
async def get_tools(request: Request, caller: CallerDep) -> dict[str, Any]:
    """The tools of the caller's tenant's active bundle catalogue (runtime role).

    ``tools`` is null when the bundle has no catalogue, ``policy`` null when no bundle
    serves the tenant. A tool not listed is denied ``unknown_tool`` outright, so a
    runtime may hide it (``cosigner-mcp-gate --hide-denied``); a listed tool may still be
    denied for its arguments.
    """
    caller.require("runtime")
    return describe_tools(context(request).store.snapshot.bundle_for(caller.tenant))
