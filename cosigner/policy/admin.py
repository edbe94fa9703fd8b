"""Policy administration use cases: list, reload, activate, shadow, shadow report.

Routes (``cosigner.http.routes.policies``) and the CLI call these; they know no HTTP. Every change
of the active or shadow version is a decision-log event in the acting admin's tenant
(``policy.activated``, ``policy.shadowed``, ``policy.refused``), appended in the same
transaction-per-use-case style as decisions.

Reloading compiles bundles in a worker thread (Rego compilation runs a child process
and golden cases run), so the event loop keeps serving decisions; the store swaps one
snapshot reference, so a decision never mixes versions.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections import Counter, defaultdict
from typing import Any

from sqlalchemy import select

from cosigner.audit.chain import Event, append
from cosigner.core.errors import NotFound
from cosigner.db.database import Database
from cosigner.db.tables import audit_events
from cosigner.policy.cases import check_bundle
from cosigner.policy.store import PolicySnapshot, PolicyStore

EXAMPLES_PER_GROUP = 5

# One admin change at a time per store: a reload (seconds, in a worker thread) builds its
# snapshot from the one it started with, so an activation meanwhile would be lost.
_LOCKS: weakref.WeakKeyDictionary[PolicyStore, asyncio.Lock] = weakref.WeakKeyDictionary()


def _lock(store: PolicyStore) -> asyncio.Lock:
    return _LOCKS.setdefault(store, asyncio.Lock())


def describe_policies(snapshot: PolicySnapshot) -> dict[str, Any]:
    """Bundles, their loaded versions (revision, engine, active/shadow) and load errors."""
    bundles = []
    for bundle_id in sorted(snapshot.bundles):
        versions = snapshot.bundles[bundle_id]
        bundles.append(
            {
                "id": bundle_id,
                "active": snapshot.active.get(bundle_id),
                "shadow": snapshot.shadow.get(bundle_id),
                "versions": [
                    {
                        "version": version,
                        "revision": bundle.revision,
                        "engine": bundle.manifest.engine,
                        "tenants": list(bundle.manifest.tenants),
                        "path": str(bundle.path),
                        "catalogue": bundle.catalogue is not None,
                    }
                    for version, bundle in sorted(versions.items())
                ],
            }
        )
    errors = [
        {"path": e.path, "message": e.message, "bundle_id": e.bundle_id, "version": e.version}
        for e in snapshot.errors
    ]
    return {"bundles": bundles, "errors": errors}


def _activation_events(
    old: PolicySnapshot, new: PolicySnapshot, actor: dict[str, Any]
) -> list[Event]:
    events = []
    for bundle_id in sorted(new.active):
        bundle = new.active_bundle(bundle_id)
        previous = old.active_bundle(bundle_id)
        if bundle is None or (previous is not None and previous.revision == bundle.revision):
            continue
        events.append(
            Event(
                type="policy.activated",
                actor=actor,
                policy=bundle.ref(),
                payload={"previous": previous.ref() if previous else None},
            )
        )
    for bundle_id, version in sorted(new.shadow.items()):
        shadow = new.shadow_bundle(bundle_id)
        if shadow is not None and old.shadow.get(bundle_id) != version:
            events.append(
                Event(
                    type="policy.shadowed",
                    actor=actor,
                    policy=shadow.ref(),
                    payload={"active": new.active.get(bundle_id)},
                )
            )
    return events


async def _record(db: Database, tenant: str, events: list[Event], now: Any) -> None:
    if events:
        async with db.transaction() as conn:
            await append(conn, tenant, events, now=now)


async def reload_policies(
    *, store: PolicyStore, db: Database, tenant: str, actor: dict[str, Any], now: Any
) -> dict[str, Any]:
    """Reload every bundle from disk (refusing any that fails to compile or its own
    tests) and record what changed. Returns :func:`describe_policies` of the result."""
    async with _lock(store):
        old = store.snapshot
        new = await asyncio.to_thread(store.reload, check=check_bundle)
    events = _activation_events(old, new, actor)
    events += [
        Event(
            type="policy.refused",
            actor=actor,
            payload={"path": e.path, "message": e.message[:2000]},
        )
        for e in new.errors
    ]
    await _record(db, tenant, events, now)
    return describe_policies(new)


async def activate_version(
    *,
    store: PolicyStore,
    db: Database,
    tenant: str,
    actor: dict[str, Any],
    now: Any,
    bundle_id: str,
    version: str,
) -> dict[str, Any]:
    """Make ``version`` the active version of ``bundle_id`` (promote or roll back).

    Raises:
        NotFound: unknown bundle id.
        PolicyError: ``unknown_policy_version`` (422) when that version is not loaded.
    """
    if bundle_id not in store.snapshot.bundles:
        raise NotFound(f"no policy bundle {bundle_id!r} is loaded")
    async with _lock(store):
        old = store.snapshot
        store.set_active(bundle_id, version)
    await _record(db, tenant, _activation_events(old, store.snapshot, actor), now)
    return describe_policies(store.snapshot)


async def shadow_version(
    *,
    store: PolicyStore,
    db: Database,
    tenant: str,
    actor: dict[str, Any],
    now: Any,
    bundle_id: str,
    version: str | None,
) -> dict[str, Any]:
    """Run ``version`` of ``bundle_id`` in shadow beside the active one (``None`` stops).

    Raises:
        NotFound: unknown bundle id. PolicyError: version not loaded.
    """
    if bundle_id not in store.snapshot.bundles:
        raise NotFound(f"no policy bundle {bundle_id!r} is loaded")
    async with _lock(store):
        old = store.snapshot
        store.set_shadow(bundle_id, version)
    events = _activation_events(old, store.snapshot, actor)
    if version is None and bundle_id in old.shadow:
        events.append(
            Event(
                type="policy.shadowed",
                actor=actor,
                payload={"bundle_id": bundle_id, "stopped": old.shadow[bundle_id]},
            )
        )
    await _record(db, tenant, events, now)
    return describe_policies(store.snapshot)


async def shadow_report(*, db: Database, tenant: str, bundle_id: str) -> dict[str, Any]:
    """Disagreements between the active and shadow versions of ``bundle_id``, from
    ``tenant``'s decision log: totals, counts by tool and by (active → shadow) effect,
    and up to :data:`EXAMPLES_PER_GROUP` example decision ids per group."""
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(audit_events.c.decision_id, audit_events.c.tool, audit_events.c.body)
                .where(
                    audit_events.c.tenant == tenant,
                    audit_events.c.type == "decision.made",
                    audit_events.c.policy_id == bundle_id,
                )
                .order_by(audit_events.c.seq)
            )
        ).all()
    compared = 0
    by_tool: Counter[str] = Counter()
    by_effect: Counter[str] = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    shadow_versions: set[str] = set()
    for row in rows:
        body = json.loads(row.body)
        shadow = (body.get("payload") or {}).get("shadow")
        if not isinstance(shadow, dict):
            continue
        compared += 1
        shadow_versions.add(str((shadow.get("policy") or {}).get("version")))
        if shadow.get("effect") == body.get("effect"):
            continue
        transition = f"{body.get('effect')} -> {shadow.get('effect')}"
        by_tool[row.tool or ""] += 1
        by_effect[transition] += 1
        if len(examples[transition]) < EXAMPLES_PER_GROUP:
            examples[transition].append(row.decision_id)
    return {
        "bundle_id": bundle_id,
        "shadow_versions": sorted(shadow_versions),
        "compared": compared,
        "disagreements": sum(by_effect.values()),
        "by_tool": dict(sorted(by_tool.items())),
        "by_effect": [
            {"transition": t, "count": n, "examples": examples[t]}
            for t, n in sorted(by_effect.items())
        ],
    }
