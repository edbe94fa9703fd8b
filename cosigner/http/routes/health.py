"""Liveness, readiness and the public JWKS."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from cosigner.http.deps import context
from cosigner.http.models.decisions import HealthV1

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthV1, responses={503: {"model": HealthV1}})
async def healthz(request: Request) -> Any:
    """The process is up and its decision log writers run. A writer whose drain task
    ended on a fault refuses every write (503) until the process restarts, so liveness
    fails (503, ``checks.log_writer`` false) and an orchestrator restarts it."""
    alive = _writers_running(request)
    return JSONResponse({"status": "ok" if alive else "failed",
                         "checks": {"log_writer": alive}},
                        status_code=200 if alive else 503)


def _writers_running(request: Request) -> bool:
    ctx = context(request)
    return ctx.log_writer.running and ctx.refusals.running


@router.get("/readyz", response_model=HealthV1, responses={503: {"model": HealthV1}})
async def readyz(request: Request) -> Any:
    """Ready when the database answers, at least one policy bundle is active (K01), the
    decision log writers run (as ``/healthz``), and no bounded queue shed work within
    ``overload_hold_s`` (so a load balancer steers new traffic elsewhere; ``Retry-After``
    then says when to look again)."""
    ctx = context(request)
    shedding = ctx.shedding.overloaded()
    checks = {"database": await ctx.db.ping(), "policies": ctx.store.ready,
              "log_writer": _writers_running(request), "not_overloaded": not shedding}
    ready = all(checks.values())
    body = {"status": "ready" if ready else "not_ready", "checks": checks}
    headers = {"Retry-After": str(ctx.settings.overload_retry_after_s)} if shedding else {}
    return JSONResponse(body, status_code=200 if ready else 503, headers=headers)


@router.get("/.well-known/jwks.json")
async def jwks(request: Request) -> dict[str, Any]:
    """Public Ed25519 keys (RFC 7517) that verify permits and audit checkpoints."""
    ctx = context(request)
    keys: dict[str, Any] = ctx.keyring.jwks(now=ctx.clock())
    return keys
