"""Who administers which policy bundle, who sees it, and whose decisions a change touches.

Policy bundles are process-wide, so administering one is a tenancy question (issue 13,
case K28):

- the tenants of a bundle are the ``tenants`` of every loaded version of it (plus, for a
  missing active version, the stored ones) and every tenant the settings map to it;
- a bundle whose tenants are exactly one tenant is administered by that tenant's admins;
  any other bundle (several tenants, or ``"*"``) only by a system **operator**: a
  principal with the built-in role ``operator`` in the system tenant ``_system``;
- a tenant admin sees a bundle only when it names or decides for their tenant; any
  other bundle answers 404 as if it did not exist.

A change's events go to the chain of every tenant whose decisions it changes (the bundle
decides for them before or after) and to ``_system``. For a ``"*"`` bundle those are the
tenants known to the database (``principals``: a tenant without principals has no key,
so it never had a decision) whose decisions that bundle makes, i.e. that have no more
specific bundle: bounded by the tenants that exist.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.audit.chain import Event, append
from cosigner.core.roles import SYSTEM_TENANT
from cosigner.db.tables import principals
from cosigner.policy.store import PolicySnapshot

OPERATOR_ROLE = "operator"


def is_operator(caller: Any) -> bool:
    """A system operator: role ``operator`` in ``_system`` (nowhere else)."""
    return bool(caller.tenant == SYSTEM_TENANT and OPERATOR_ROLE in caller.roles)


def bundle_tenants(snap: PolicySnapshot, bundle_id: str) -> set[str]:
    """Every tenant a version of ``bundle_id`` names or the settings map to it."""
    tenants: set[str] = set(snap.missing.get(bundle_id, ()))
    for bundle in snap.bundles.get(bundle_id, {}).values():
        tenants.update(bundle.manifest.tenants)
    tenants.update(t for t, mapped in snap.tenant_bundles.items() if mapped == bundle_id)
    return tenants


def known(snap: PolicySnapshot, bundle_id: str) -> bool:
    return bundle_id in snap.bundles or bundle_id in snap.missing


def administrator(snap: PolicySnapshot, bundle_id: str) -> str | None:
    """The one tenant whose admins administer ``bundle_id``; ``None``: operators only."""
    tenants = bundle_tenants(snap, bundle_id)
    if len(tenants) == 1 and "*" not in tenants:
        return next(iter(tenants))
    return None


def visible_to(snap: PolicySnapshot, tenant: str, bundle_id: str) -> bool:
    """Whether ``tenant``'s admins may know ``bundle_id`` exists: it names their tenant
    or decides for it."""
    return known(snap, bundle_id) and (
        tenant in bundle_tenants(snap, bundle_id) or snap.route(tenant) == bundle_id)


async def known_tenants(conn: AsyncConnection) -> list[str]:
    """Tenants with principals (every tenant that can ask for a decision)."""
    rows = await conn.execute(select(principals.c.tenant).distinct()
                              .where(principals.c.tenant != SYSTEM_TENANT))
    return sorted(rows.scalars())


async def affected_tenants(conn: AsyncConnection, snaps: Iterable[PolicySnapshot],
                           bundle_ids: set[str]) -> list[str]:
    """Tenants for whom one of ``bundle_ids`` decides in any of ``snaps`` (before and
    after a change); see the module docstring for ``"*"`` bundles."""
    snaps = list(snaps)
    candidates: set[str] = set()
    for snap in snaps:
        for bundle_id in bundle_ids:
            candidates |= bundle_tenants(snap, bundle_id)
    if "*" in candidates:
        candidates |= set(await known_tenants(conn))
    return sorted(t for t in candidates - {"*", SYSTEM_TENANT}
                  if any(snap.route(t) in bundle_ids for snap in snaps))


class Fanout:
    """Events of one change, collected per chain: each tenant it names plus ``_system``
    (which gets every event; its copy may carry more, e.g. the tenant list or a path,
    because a tenant's copy never names other tenants or the server's folders)."""

    def __init__(self) -> None:
        self.by_tenant: dict[str, list[Event]] = {}

    def add(self, event: Event, tenants: Iterable[str], *,
            system_payload: dict[str, Any] | None = None) -> None:
        for tenant in tenants:
            if tenant != SYSTEM_TENANT:
                self.by_tenant.setdefault(tenant, []).append(event)
        system = event
        if system_payload:
            fields = {name: getattr(event, name) for name in Event.__dataclass_fields__}
            system = Event(**{**fields, "payload": {**(event.payload or {}),
                                                     **system_payload}})
        self.by_tenant.setdefault(SYSTEM_TENANT, []).append(system)

    async def append(self, conn: AsyncConnection, *, now: Any) -> None:
        """Append inside the caller's transaction; heads locked in sorted tenant order,
        like every other multi-tenant writer."""
        for tenant in sorted(self.by_tenant):
            await append(conn, tenant, self.by_tenant[tenant], now=now)
