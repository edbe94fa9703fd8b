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
from typing import Any

from fastapi import FastAPI

from cosigner import web
from cosigner.context import AppContext
from cosigner.core import tracing
from cosigner.core.clock import Clock, system_clock
from cosigner.core.load import Shedding
from cosigner.core.settings import Settings, get_settings
from cosigner.db.database import Database
from cosigner.decisions.pdp import decision_log_writer
from cosigner.http import openapi, problems
from cosigner.http.edge import CosignerAPI, Edge
from cosigner.http.lean import HotRoutes
from cosigner.http.metrics_port import serve_metrics
from cosigner.http.proxies import TrustedProxies
from cosigner.http.ratelimit import RateLimit
from cosigner.http.routes import approvals as approvals_routes
from cosigner.http.routes import approvers as approvers_routes
from cosigner.http.routes import audit as audit_routes
from cosigner.http.routes import decisions as decisions_routes
from cosigner.http.routes import health as health_routes
from cosigner.http.routes import metrics as metrics_routes
from cosigner.http.routes import permits as permits_routes
from cosigner.http.routes import policies as policies_routes
from cosigner.http.routes import runs as runs_routes
from cosigner.http.routes import slack as slack_routes
from cosigner.http.routes import tools as tools_routes
from cosigner.http.telemetry import RequestTelemetry
from cosigner.identity.principals import KeyAuthenticator
from cosigner.identity.quotas import Quotas
from cosigner.keys.store import open_keyring
from cosigner.permits.redeem import refusal_writer
from cosigner.policy.cases import check_bundle
from cosigner.policy.store import PolicyStore, engine_factory
from cosigner.tasks import Tasks
from cosigner.webhooks.outbox import Backlog

log = logging.getLogger("cosigner")

NO_BUNDLE_WARNING = (
    "no policy bundle found in %s: every decision will be denied (policy_not_loaded) and "
    "/readyz stays 503; write a starter bundle with `cosigner init DIR` and set "
    "COSIGNER_BUNDLE_DIRS")


async def build_context(settings: Settings, clock: Clock) -> AppContext:
    """Open the database, load the keyring (from the database) and the policy
    bundles: the app's one context."""
    db = Database(settings.database_url, busy_timeout_ms=settings.db_busy_timeout_ms)
    key_store, keyring = await open_keyring(db, settings, now=clock())
    # Managed: nothing is active until the follower installs the stored policy state.
    shedding = Shedding(hold_s=settings.overload_hold_s,
                        retry_after_s=settings.overload_retry_after_s)
    store = PolicyStore(settings.bundle_dirs, managed=True, engine_factory=engine_factory(
        opa_url=settings.opa_url, opa_timeout_ms=settings.opa_timeout_ms))
    snapshot = store.reload(check=check_bundle)
    for error in snapshot.errors:
        log.error("policy bundle not loaded: %s: %s", error.path, error.message)
    if not store.discover():
        log.warning(NO_BUNDLE_WARNING, ", ".join(str(d.resolve()) for d in settings.bundle_dirs))
    return AppContext(settings=settings, clock=clock, db=db, store=store, keyring=keyring,
                      key_store=key_store,
                      authenticator=KeyAuthenticator(db),
                      log_writer=decision_log_writer(db, settings, shedding),
                      refusals=refusal_writer(db, settings, shedding),
                      quotas=Quotas(settings, db, clock), shedding=shedding,
                      webhook_backlog=Backlog(settings.webhook_backlog_max))


def create_app(settings: Settings | None = None, *, clock: Clock | None = None
               ) -> CosignerAPI:
    """Build the ASGI app. ``settings`` defaults to the environment (``COSIGNER_*``).

    The lifespan puts the :class:`AppContext` on ``app.state.context`` (routes read it
    through :func:`cosigner.http.deps.context`) and the background :class:`Tasks` on
    ``app.state.tasks``.
    """
    settings = settings or get_settings()
    clock = clock or system_clock
    tracing.configure()  # on only when the OTEL_* variables ask for it

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = await build_context(settings, clock)
        tasks = Tasks(ctx)
        app.state.context, app.state.tasks = ctx, tasks
        await tasks.start()
        metrics_server = None
        if settings.metrics_port is not None:
            metrics_server = await serve_metrics(ctx, settings.metrics_host,
                                                 settings.metrics_port)
        _log_startup(ctx, getattr(app.state, "listen", None))
        _tune_gc()
        try:
            yield
        finally:
            if metrics_server is not None:
                metrics_server.close()
                await metrics_server.wait_closed()
            await tasks.stop()
            await ctx.db.dispose()

    app = CosignerAPI(
        title="Cosigner",
        version="0.1.0",
        summary="Policy decision and approval server for AI-agent tool calls.",
        lifespan=lifespan,
        generate_unique_id_function=openapi.operation_id,
        **_no_framework_telemetry(),
    )
    app.state.settings = settings
    problems.install(app)
    app.include_router(health_routes.router)
    app.include_router(metrics_routes.router)
    app.include_router(decisions_routes.router)
    app.include_router(approvals_routes.router)
    app.include_router(permits_routes.router)
    app.include_router(policies_routes.router)
    app.include_router(runs_routes.router)
    app.include_router(tools_routes.router)
    app.include_router(audit_routes.router)
    app.include_router(slack_routes.router)
    app.include_router(approvers_routes.router)
    web.install(app)
    # The hot routes are answered ahead of this whole stack (cosigner.http.edge), which
    # does what these middlewares do for them; while tracing is on they take the stack,
    # whose innermost layer answers them without FastAPI's router (cosigner.http.lean).
    app.edge = Edge(trusted=settings.forwarded_allow_ips, access=settings.access_log)
    app.add_middleware(HotRoutes)
    app.add_middleware(RequestTelemetry, access=settings.access_log)
    # Rate limits before routing: a refused request must cost far less than a decision.
    app.add_middleware(RateLimit)
    # Outermost, so every route and middleware sees the real client, scheme and host.
    app.add_middleware(TrustedProxies, trusted=settings.forwarded_allow_ips)
    openapi.install(app)
    return app


def _no_framework_telemetry() -> dict[str, Any]:
    """FastAPI versions with native OpenTelemetry (``FastAPI(telemetry=...)``) would add
    their own request spans beside ours (:mod:`cosigner.http.telemetry`) and log exception
    messages (which may quote arguments): turned off where the option exists."""
    import inspect

    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False,
                          "operation_spans": False, "auto_configure": False}}


def database_label(url: str) -> str:
    """``url`` without user name, password and query (for logs)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)  # the query is left out too: it may carry a password
    host = f"{parsed.host}:{parsed.port}" if parsed.port else (parsed.host or "")
    return f"{parsed.drivername}://{host}/{parsed.database or ''}"


def _log_startup(ctx: AppContext, listen: str | None) -> None:
    """One line: database (no credentials), active bundles with versions, key ids, the
    address; a warning when no bundle serves any tenant (every decision is then denied
    ``policy_not_loaded``)."""
    snapshot = ctx.store.snapshot
    bundles = ", ".join(f"{bundle_id}@{version}"
                        for bundle_id, version in sorted(snapshot.active.items())) or "none"
    kids = ", ".join(info.kid for info in ctx.keyring.keys())
    log.info("cosigner started: database=%s bundles=[%s] keys=[%s] signing=%s listen=%s",
             database_label(ctx.settings.database_url), bundles, kids,
             ctx.keyring.current_kid, listen or "-")
    if not snapshot.active:
        dirs = ", ".join(str(d) for d in ctx.settings.bundle_dirs)
        log.warning("no policy bundle serves any tenant (searched: %s): every decision is "
                    "denied policy_not_loaded until one is loaded", dirs)


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
