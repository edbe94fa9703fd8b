"""Policy state in the database: the active and shadow version of each bundle.

The ``policy_state`` table (:mod:`cosigner.db.tables_policy`) holds one row per bundle id;
every replica reads it at start and follows it (:mod:`cosigner.policy.follower`), so the
choice of version survives restarts and is the same on every replica. Bundle files stay
on each server's disk: :func:`resolve` matches the stored choice against what a process
loaded.

Rules (DESIGN invariant 1, fail closed):

- a bundle with a row decides with its stored active version; a version on disk but not
  stored never becomes active by itself;
- a bundle without a row (never activated) decides with its newest version, and the first
  process to load it stores that choice (the first activation, logged);
- a stored active version that this process has not loaded (the bundle is present —
  another version loaded or a version refused — but not that one) makes the bundle
  *missing*: the tenants it served (``active_tenants`` of the row) are denied
  ``policy_not_loaded`` until it is loaded or another version is activated. A row whose
  bundle has no trace on this server's disk at all is ignored (logged by the follower);
- versions are matched by version string; the stored revision is the one at activation
  and a different revision of that version on disk is used and logged (the revision is
  in every decision record).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.db.database import dialect_insert
from cosigner.db.tables_policy import policy_state


@dataclass(frozen=True)
class BundleState:
    """One ``policy_state`` row."""

    bundle_id: str
    active_version: str
    active_revision: str
    active_tenants: tuple[str, ...]
    shadow_version: str | None
    generation: int
    changed_at: datetime
    changed_by: dict[str, Any]


@dataclass(frozen=True)
class Resolved:
    """What a process decides with, given its loaded bundles and the stored state."""

    active: dict[str, str]
    shadow: dict[str, str]
    #: bundle id → tenants of a stored active version that is not loaded here.
    missing: dict[str, tuple[str, ...]]


def resolve(versions: Mapping[str, Iterable[str]], present: set[str],
            state: Mapping[str, BundleState], newest: Any) -> Resolved:
    """Apply the rules of this module. ``versions``: loaded versions per bundle id;
    ``present``: bundle ids with any trace on disk (loaded or refused); ``newest(ids)``
    picks the newest version string."""
    active: dict[str, str] = {}
    shadow: dict[str, str] = {}
    missing: dict[str, tuple[str, ...]] = {}
    for bundle_id, loaded in versions.items():
        loaded = set(loaded)
        row = state.get(bundle_id)
        if row is None:
            if loaded:
                active[bundle_id] = newest(loaded)
            continue
        if row.active_version in loaded:
            active[bundle_id] = row.active_version
        else:
            missing[bundle_id] = row.active_tenants
        if row.shadow_version is not None and row.shadow_version in loaded \
                and row.shadow_version != row.active_version:
            shadow[bundle_id] = row.shadow_version
    for bundle_id, row in state.items():
        if bundle_id not in versions and bundle_id in present:
            missing[bundle_id] = row.active_tenants
    return Resolved(active, shadow, missing)


def fingerprint(state: Mapping[str, BundleState]) -> dict[str, int]:
    """Bundle id → generation: equal fingerprints mean an unchanged state."""
    return {bundle_id: row.generation for bundle_id, row in state.items()}


async def read_state(conn: AsyncConnection, *, lock: bool = False) -> dict[str, BundleState]:
    """Every row (the table holds one per bundle: tens). ``lock``: PostgreSQL
    ``FOR UPDATE`` so a change reads and writes under one lock."""
    query = select(policy_state).order_by(policy_state.c.bundle_id)
    if lock and conn.dialect.name == "postgresql":
        query = query.with_for_update()
    rows = (await conn.execute(query)).all()
    return {
        row.bundle_id: BundleState(
            bundle_id=row.bundle_id, active_version=row.active_version,
            active_revision=row.active_revision, active_tenants=tuple(row.active_tenants),
            shadow_version=row.shadow_version, generation=int(row.generation),
            changed_at=row.changed_at, changed_by=dict(row.changed_by))
        for row in rows
    }


def _values(row: BundleState) -> dict[str, Any]:
    return {"bundle_id": row.bundle_id, "active_version": row.active_version,
            "active_revision": row.active_revision,
            "active_tenants": list(row.active_tenants), "shadow_version": row.shadow_version,
            "generation": row.generation, "changed_at": row.changed_at,
            "changed_by": row.changed_by}


async def insert_first(conn: AsyncConnection, row: BundleState) -> bool:
    """Store a first activation unless another process stored one first; True when this
    call inserted the row."""
    insert = dialect_insert(conn.dialect.name)
    result = await conn.execute(insert(policy_state).values(**_values(row))
                                .on_conflict_do_nothing(index_elements=["bundle_id"]))
    return bool(result.rowcount)


async def write_state(conn: AsyncConnection, row: BundleState,
                      previous: BundleState | None) -> None:
    """Replace ``previous`` (read under lock in this transaction) by ``row``."""
    if previous is None:
        await conn.execute(policy_state.insert().values(**_values(row)))
    else:
        await conn.execute(policy_state.update()
                           .where(policy_state.c.bundle_id == row.bundle_id)
                           .values(**_values(row)))


# One change of the store at a time per process: a reload (seconds, in a worker thread)
# builds its snapshot from the one it started with, so an activation meanwhile (or the
# follower installing another replica's change) would be lost.
_LOCKS: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()


def change_lock(store: Any) -> asyncio.Lock:
    """The lock every change of ``store``'s snapshot takes (admin use cases, follower)."""
    return _LOCKS.setdefault(store, asyncio.Lock())
