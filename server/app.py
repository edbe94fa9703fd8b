"""The composition root: ``create_app(settings)`` builds every collaborator.

Nothing is created at import time. Collaborators that touch disk, the database or
the network (database engine, keyring, policy store) are built in the lifespan, so
``create_app().openapi()`` is side-effect free.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from server import web
from server.api import approvals as approvals_routes
from server.api import audit as audit_routes
from server.api import decisions as decisions_routes
from server.api import health as health_routes
from server.api import permits as permits_routes
from server.api import policies as policies_routes
from server.api import problems
from server.api import runs as runs_routes
from server.api import tools as tools_routes
from server.api.models import ProblemV1
from server.approval_runtime import ApprovalRuntime
from server.audit.runtime import AuditRuntime
from server.clock import Clock, system_clock
from server.db.database import Database
from server.decisions import Deps, decision_log_writer
from server.keys import Keyring
from server.policy.cases import check_bundle
from server.policy.follower import PolicyFollower
from server.policy.store import PolicyStore, engine_factory
from server.principals import KeyAuthenticator
from server.settings import Settings, get_settings

log = logging.getLogger("cosigner")


@dataclass
class Services:
    """Everything routes need, built once per app."""

    deps: Deps
    authenticator: KeyAuthenticator
    extras: dict[str, Any] = field(default_factory=dict)


async def build_services(settings: Settings, clock: Clock) -> Services:
    """Open the database, load the keyring and the policy bundles."""
    db = Database(settings.database_url, busy_timeout_ms=settings.db_busy_timeout_ms)
    keyring = Keyring.load_or_create(settings.key_dir, now=clock(),
                                     max_token_lifetime_s=settings.max_permit_ttl_s)
    # Managed: nothing is active until the follower installs the stored policy state.
    store = PolicyStore(settings.bundle_dirs, managed=True, engine_factory=engine_factory(
        opa_url=settings.opa_url, opa_timeout_ms=settings.opa_timeout_ms))
    snapshot = store.reload(check=check_bundle)
    for error in snapshot.errors:
        log.error("policy bundle not loaded: %s: %s", error.path, error.message)
    deps = Deps(db=db, store=store, keyring=keyring, clock=clock, settings=settings,
                log_writer=decision_log_writer(db, settings))
    return Services(deps=deps, authenticator=KeyAuthenticator(db))


def create_app(settings: Settings | None = None, *, clock: Clock | None = None) -> FastAPI:
    """Build the ASGI app. ``settings`` defaults to the environment (``COSIGNER_*``)."""
    settings = settings or get_settings()
    clock = clock or system_clock

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = await build_services(settings, clock)
        app.state.services = services
        services.deps.log_writer.start()
        policy_follower = PolicyFollower(services.deps)
        services.extras["policy_follower"] = policy_follower
        await policy_follower.start()
        webhook_worker = _start_webhook_worker(services, settings, clock)
        audit = AuditRuntime(services.deps)
        services.extras["audit"] = audit
        await audit.start()
        approvals_runtime = ApprovalRuntime(services.deps)
        services.extras["approvals"] = approvals_runtime
        await approvals_runtime.start()
        _tune_gc()
        try:
            yield
        finally:
            await approvals_runtime.stop()
            await audit.stop()
            await policy_follower.stop()
            await services.deps.log_writer.stop()
            if webhook_worker is not None:
                await webhook_worker.stop()
            await services.deps.db.dispose()

    app = FastAPI(
        title="Cosigner",
        version="0.1.0",
        summary="Policy decision and approval server for AI-agent tool calls.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    problems.install(app)
    app.include_router(health_routes.router)
    app.include_router(decisions_routes.router)
    app.include_router(approvals_routes.router)
    app.include_router(permits_routes.router)
    app.include_router(policies_routes.router)
    app.include_router(runs_routes.router)
    app.include_router(tools_routes.router)
    app.include_router(audit_routes.router)
    web.install(app)
    _register_schemas(app)
    return app


def _tune_gc() -> None:
    """Fewer, cheaper garbage collections on the request path: what startup built
    (modules, bundles, schemas, keys) moves out of the collector's view for good, and the
    youngest generation is collected every 10,000 net allocations instead of 700 (a
    request allocates thousands of objects). Part of the hot-path work in bench/README.md;
    in-process it saved ~5 % of CPU per decision, within that run's noise."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(10_000, older, oldest)


def _start_webhook_worker(services: Services, settings: Settings, clock: Clock) -> Any:
    """Run the webhook delivery worker when any receiver is configured."""
    if not settings.webhooks:
        return None
    from server.webhooks.worker import WebhookWorker

    worker = WebhookWorker(services.deps.db, settings, clock)
    services.extras["webhook_worker"] = worker
    worker.start()
    return worker


def _register_schemas(app: FastAPI) -> None:
    """Add the models of self-parsed bodies and problem documents to the OpenAPI schema."""
    from server.api.models import DecisionRequestV1
    from server.api.models_approvals import RedeemRequestV1, ReviewAskV1, ReviewRequestV1
    from server.api.models_runs import OutcomeReportV1, RunContractV1

    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = original()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (DecisionRequestV1, ProblemV1, RunContractV1, OutcomeReportV1,
                      ReviewAskV1, ReviewRequestV1, RedeemRequestV1):
            model_schema = model.model_json_schema(
                ref_template="#/components/schemas/{model}")
            for name, sub in model_schema.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components[model.__name__] = model_schema
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
