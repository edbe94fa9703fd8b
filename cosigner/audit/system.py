"""Events about the server itself: policy bundles loaded/refused/activated, signing keys.

Policy bundles and the signing keyring are process-wide (one bundle may serve every tenant
via ``tenants = ["*"]``), so these events go to one chain of their own, the system tenant
:data:`SYSTEM_TENANT`. Its name cannot be a real tenant id (tenant ids start with a letter
or digit), so no API key ever reads it; operators export it with
``cosigner audit export --tenant _system``. Principal events belong to their tenant's chain
(:mod:`cosigner.identity.principals`).

Recording is best effort where a failure must not stop the server from starting (the
caller logs it); policy and key changes also go to the error log.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import select

from cosigner.audit.chain import Event, append
from cosigner.core.clock import isoformat
from cosigner.db.database import Database
from cosigner.db.tables import audit_events
from cosigner.keys.keyring import Keyring
from cosigner.policy.store import PolicySnapshot

SYSTEM_TENANT = "_system"
SYSTEM_ACTOR: dict[str, Any] = {"subject": "system", "principal_id": None, "kind": "system"}


def policy_events(old: PolicySnapshot, new: PolicySnapshot, *,
                  actor: dict[str, Any] = SYSTEM_ACTOR) -> list[Event]:
    """``policy.loaded`` for each bundle version new in ``new`` (or with a new revision),
    ``policy.refused`` for each load error, ``policy.activated`` for each changed active
    version — in that order."""
    events: list[Event] = []
    for bundle_id, versions in sorted(new.bundles.items()):
        for version, bundle in sorted(versions.items()):
            before = old.bundles.get(bundle_id, {}).get(version)
            if before is None or before.revision != bundle.revision:
                events.append(Event(type="policy.loaded", actor=actor, policy=bundle.ref(),
                                    payload={"path": str(bundle.path),
                                             "engine": bundle.manifest.engine,
                                             "tenants": list(bundle.manifest.tenants)}))
    for error in new.errors:
        events.append(Event(type="policy.refused", actor=actor,
                            payload={"path": error.path, "message": error.message[:2000],
                                     "bundle_id": error.bundle_id, "version": error.version}))
    for bundle_id, version in sorted(new.active.items()):
        if old.active.get(bundle_id) != version:
            active = new.active_bundle(bundle_id)
            events.append(Event(type="policy.activated", actor=actor,
                                policy=active.ref() if active else None,
                                payload={"previous": old.active.get(bundle_id)}))
    return events


async def record_policy_change(db: Database, old: PolicySnapshot, new: PolicySnapshot, *,
                               now: datetime, actor: dict[str, Any] = SYSTEM_ACTOR) -> int:
    """Append :func:`policy_events` to the system chain; returns how many were recorded.

    Call after every ``PolicyStore.reload()`` / ``set_active()`` (startup does; the policy
    reload API should too). Raises :class:`~cosigner.core.errors.Unavailable` on storage failure.
    """
    events = policy_events(old, new, actor=actor)
    if events:
        async with db.transaction() as conn:
            await append(conn, SYSTEM_TENANT, events, now=now)
    return len(events)


async def record_keyring(db: Database, keyring: Keyring, *, now: datetime) -> int:
    """Record ``key.created`` for every key of ``keyring`` not yet in the system chain."""
    async with db.transaction() as conn:
        rows = (await conn.execute(select(audit_events.c.body).where(
            audit_events.c.tenant == SYSTEM_TENANT,
            audit_events.c.type.in_(("key.created", "key.rotated"))))).all()
        known: set[str] = set()
        for row in rows:
            payload = json.loads(row.body).get("payload", {})
            known.update(k for k in (payload.get("kid"), payload.get("new_kid")) if k)
        events = [Event(type="key.created", actor=SYSTEM_ACTOR,
                        payload={"kid": info.kid, "alg": "Ed25519",
                                 "created_at": isoformat(info.created_at),
                                 "retired_at": isoformat(info.retired_at)
                                 if info.retired_at else None})
                  for info in keyring.keys() if info.kid not in known]
        if events:
            await append(conn, SYSTEM_TENANT, events, now=now)
    return len(events)


async def record_key_rotated(db: Database, *, old_kid: str, new_kid: str, now: datetime,
                             actor: dict[str, Any] = SYSTEM_ACTOR) -> None:
    """Record ``key.rotated`` (``old_kid`` retired, ``new_kid`` signs from now on)."""
    async with db.transaction() as conn:
        await append(conn, SYSTEM_TENANT, [Event(
            type="key.rotated", actor=actor,
            payload={"old_kid": old_kid, "new_kid": new_kid, "kid": new_kid})], now=now)
