"""Routes for policy administration (admin role): list, reload, activate, shadow."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from cosigner.http.body import openapi_body, strict_body
from cosigner.http.deps import PROBLEM_RESPONSES, CallerDep, context
from cosigner.http.models.decisions import Wire
from cosigner.policy import admin

router = APIRouter(prefix="/v1/policies", tags=["policies"])


class ActivateV1(Wire):
    version: str = Field(min_length=1, max_length=64)


class ShadowV1(Wire):
    version: str | None = Field(max_length=64, description="null stops shadowing")


def _context(request: Request, caller: Any) -> dict[str, Any]:
    deps = context(request)
    return {
        "store": deps.store,
        "db": deps.db,
        "tenant": caller.tenant,
        "actor": caller.actor(),
        "now": deps.clock(),
    }


@router.get("", responses=PROBLEM_RESPONSES)
async def list_policies(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Loaded bundles: versions, revisions, engine, active and shadow version, and the
    load errors of the last reload (admin)."""
    caller.require("admin")
    return admin.describe_policies(context(request).store.snapshot)


@router.post("/reload", responses=PROBLEM_RESPONSES)
async def reload_policies(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Reload every bundle from disk atomically (admin). A bundle that fails to compile
    or its own tests is refused and listed in ``errors``; its previous version stays."""
    caller.require("admin")
    return await admin.reload_policies(**_context(request, caller))


@router.post(
    "/{bundle_id}/activate", responses=PROBLEM_RESPONSES, openapi_extra=openapi_body(ActivateV1)
)
async def activate(bundle_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """Make a loaded version the active one: promote a shadow or roll back (admin).
    404 unknown bundle; 422 ``unknown_policy_version``."""
    caller.require("admin")
    body, _ = await strict_body(request, ActivateV1, context(request).settings.max_body_bytes)
    return await admin.activate_version(
        **_context(request, caller), bundle_id=bundle_id, version=body.version
    )


@router.post(
    "/{bundle_id}/shadow", responses=PROBLEM_RESPONSES, openapi_extra=openapi_body(ShadowV1)
)
async def set_shadow(bundle_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """Evaluate a loaded version beside the active one on every decision, never acted on
    (``{"version": null}`` stops it) (admin)."""
    caller.require("admin")
    body, _ = await strict_body(request, ShadowV1, context(request).settings.max_body_bytes)
    return await admin.shadow_version(
        **_context(request, caller), bundle_id=bundle_id, version=body.version
    )


@router.get("/{bundle_id}/shadow", responses=PROBLEM_RESPONSES)
async def shadow_report(bundle_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """Where the shadow version disagreed with the active one in this tenant's decisions:
    counts by tool and by ``active -> shadow`` effect, with example decision ids (admin)."""
    caller.require("admin")
    return await admin.shadow_report(
        db=context(request).db, tenant=caller.tenant, bundle_id=bundle_id
    )
