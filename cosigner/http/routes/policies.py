"""Routes for policy administration (tenant admins and system operators): list, reload,
activate, shadow. Who may do what: :mod:`cosigner.policy.tenancy`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request

from cosigner.core.errors import InvalidRequest
from cosigner.http.body import openapi_body, strict_body
from cosigner.http.deps import PROBLEM_RESPONSES, CallerDep, context
from cosigner.http.models.policies import ActivateV1, ReplayV1, ShadowV1
from cosigner.policy import admin, replay

router = APIRouter(prefix="/v1/policies", tags=["policies"])


def _moment(name: str, text: str | None) -> datetime | None:
    """An RFC 3339 time (naive: UTC); raises :class:`InvalidRequest` ``invalid_time``."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise InvalidRequest(f"{name} is not an RFC 3339 time", code="invalid_time") from exc
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _context(request: Request, caller: Any) -> dict[str, Any]:
    deps = context(request)
    return {"store": deps.store, "db": deps.db, "caller": caller, "now": deps.clock()}


@router.get("", responses=PROBLEM_RESPONSES)
async def list_policies(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Bundles with their versions, revisions, engine, active and shadow version, and
    the load errors of the last reload. A tenant admin sees only the bundles that name or
    decide for their tenant, without filesystem paths; a system operator sees all."""
    return admin.list_policies(store=context(request).store, caller=caller)


@router.post("/reload", responses=PROBLEM_RESPONSES)
async def reload_policies(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Reload every bundle from this server's disk atomically (system operator only;
    tenant admins get 403 ``not_policy_admin``). A bundle that fails to compile or its own
    tests is refused and listed in ``errors``; its previous version stays."""
    return await admin.reload_policies(**_context(request, caller))


@router.post(
    "/{bundle_id}/activate", responses=PROBLEM_RESPONSES, openapi_extra=openapi_body(ActivateV1)
)
async def activate_version(bundle_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """Make a loaded version the active one on every replica: promote a shadow or roll
    back. A bundle serving only your tenant: its admins; any other: a system operator
    (403 ``not_policy_admin``). 404 unknown (or not your tenant's) bundle; 422
    ``unknown_policy_version``."""
    body, _ = await strict_body(request, ActivateV1, context(request).settings.max_body_bytes)
    return await admin.activate_version(
        **_context(request, caller), bundle_id=bundle_id, version=body.version
    )


@router.post(
    "/{bundle_id}/shadow", responses=PROBLEM_RESPONSES, openapi_extra=openapi_body(ShadowV1)
)
async def set_shadow(bundle_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """Evaluate a loaded version beside the active one on every decision, never acted on
    (``{"version": null}`` stops it); same administrators as activate."""
    body, _ = await strict_body(request, ShadowV1, context(request).settings.max_body_bytes)
    return await admin.shadow_version(
        **_context(request, caller), bundle_id=bundle_id, version=body.version
    )


@router.get("/{bundle_id}/shadow", responses=PROBLEM_RESPONSES)
async def get_shadow_report(bundle_id: str, request: Request, caller: CallerDep) -> dict[str, Any]:
    """Where the shadow version disagreed with the active one in this tenant's decisions
    (a system operator: every tenant's): counts by tool and by ``active -> shadow``
    effect, with example decision ids (admin)."""
    deps = context(request)
    return await admin.shadow_report(store=deps.store, db=deps.db, caller=caller,
                                     bundle_id=bundle_id)


@router.post(
    "/{bundle_id}/replay", responses=PROBLEM_RESPONSES, openapi_extra=openapi_body(ReplayV1)
)
async def replay_candidate(bundle_id: str, request: Request, caller: CallerDep
                           ) -> dict[str, Any]:
    """Evaluate a loaded version of the bundle on the tenant's logged decisions in
    ``[since, until)`` and report effect transitions by tool (examples with decision ids),
    decisions that could not be replayed (masked values the candidate reads, by pointer)
    and the candidate's errors. Writes only one ``policy.replayed`` event. Same
    administrators as activate."""
    body, _ = await strict_body(request, ReplayV1, context(request).settings.max_body_bytes)
    return await replay.replay_version(
        **_context(request, caller), bundle_id=bundle_id, version=body.version,
        tenant=body.tenant, since=_moment("since", body.since),
        until=_moment("until", body.until))
