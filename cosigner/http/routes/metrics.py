"""``GET /metrics``: Prometheus text exposition (README § Operations, Metrics).

On the API port: off (404) unless ``COSIGNER_METRICS_TOKEN`` is set; then a scrape must send
``Authorization: Bearer <token>`` (compared in constant time; 401 otherwise). Counters and
histograms come from :mod:`cosigner.core.metrics` (summed over workers in multiprocess
mode); the gauges below are computed at scrape time, so every worker answers the same.
``COSIGNER_METRICS_PORT`` serves the same :func:`scrape` without a token
(:mod:`cosigner.http.metrics_port`).
"""

from __future__ import annotations

import hmac
from datetime import datetime
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request, Response

from cosigner.approvals.queries import pending_by_tenant
from cosigner.context import AppContext
from cosigner.core.errors import NotFound, Unauthenticated
from cosigner.core.metrics import exposition
from cosigner.http.deps import context, several_credentials

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

# prometheus-client is imported by the first scrape or series recorded, not at startup
# (cosigner.core.metrics; issue 20, idle memory).

router = APIRouter()

#: Tenants labelled one by one in ``cosigner_approvals_pending`` (largest first); the
#: rest are summed under ``tenant="_other"``.
MAX_TENANT_LABELS = 20


@router.get("/metrics", include_in_schema=False)
async def get_metrics(request: Request) -> Response:
    """The process's (or the workers') series in Prometheus text format 0.0.4."""
    ctx = context(request)
    token = ctx.settings.metrics_token
    if token is None:
        raise NotFound("metrics are off (set COSIGNER_METRICS_TOKEN)")
    values = request.headers.getlist("authorization")
    if len(values) > 1:
        raise several_credentials()
    scheme, _, given = (values[0] if values else "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), token.get_secret_value().encode()):
        raise Unauthenticated("the metrics token is required (Authorization: Bearer ...)")
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(await scrape(ctx), media_type=CONTENT_TYPE_LATEST)


async def scrape(ctx: AppContext) -> bytes:
    """The exposition: stored series plus the scrape-time gauges."""
    return exposition([await _pending(ctx), *_bundles(ctx), _key_age(ctx, ctx.clock())])


async def _pending(ctx: AppContext) -> Metric:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily("cosigner_approvals_pending",
                               "Pending approval requests, per tenant (the largest "
                               f"{MAX_TENANT_LABELS}; the rest summed as _other).",
                               labels=["tenant"])
    counts = sorted((await pending_by_tenant(ctx.db)).items(), key=lambda kv: (-kv[1], kv[0]))
    for tenant, count in counts[:MAX_TENANT_LABELS]:
        family.add_metric([tenant], count)
    rest = sum(count for _, count in counts[MAX_TENANT_LABELS:])
    if rest:
        family.add_metric(["_other"], rest)
    return family


def _bundles(ctx: AppContext) -> list[Metric]:
    from prometheus_client.core import InfoMetricFamily

    info = InfoMetricFamily("cosigner_policy_bundle",
                            "Policy bundle versions this process decides with (role "
                            "active or shadow).",
                            labels=["bundle", "role"])
    snapshot = ctx.store.snapshot
    for role, chosen in (("active", snapshot.active), ("shadow", snapshot.shadow)):
        for bundle_id, version in sorted(chosen.items()):
            bundle = snapshot.bundles.get(bundle_id, {}).get(version)
            if bundle is None:
                continue
            ref = bundle.ref()
            info.add_metric([bundle_id, role], {"version": ref["version"],
                                                "revision": ref["revision"],
                                                "engine": bundle.manifest.engine})
    return [info]


def _key_age(ctx: AppContext, now: datetime) -> Metric:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily("cosigner_signing_key_age_seconds",
                               "Age of the signing key currently in use.", labels=["kid"])
    current = ctx.keyring.current_kid
    for info in ctx.keyring.keys():
        if info.kid == current:
            family.add_metric([info.kid], (now - info.created_at).total_seconds())
    return family
