"""Policy administration use cases: list, reload, activate, shadow, shadow report.

Routes (``cosigner.http.routes.policies``) and the CLI call these; they know no HTTP. Who may do
what is :mod:`cosigner.policy.tenancy`: a bundle serving one tenant is administered by that
tenant's admins, any other bundle and every reload by a system operator. Every change is
an event in ``_system`` and in the chain of each tenant whose decisions it touches
(``policy.activated``, ``policy.shadowed``, ``policy.refused``; ``policy.loaded`` carries
paths, so ``_system`` only), committed in the same transaction as the change of the
stored state (:mod:`cosigner.policy.state`), which every replica follows. A refused
attempt (``policy.admin_refused``) goes to ``_system`` and the actor's own chain
(:func:`authorize`).

Reloading compiles bundles in a worker thread (Rego compilation runs a child process
and golden cases run), so the event loop keeps serving decisions; the store swaps one
snapshot reference, so a decision never mixes versions.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy import select

from cosigner.audit.chain import Event
from cosigner.core.errors import CosignerError, Forbidden, NotFound, PolicyError
from cosigner.db import event_row
from cosigner.db.database import Database
from cosigner.db.tables import audit_events
from cosigner.policy.cases import check_bundle
from cosigner.policy.state import BundleState, change_lock, insert_first, read_state, write_state
from cosigner.policy.store import PolicySnapshot, PolicyStore, newest_version
from cosigner.policy.tenancy import (
    Fanout,
    administrator,
    affected_tenants,
    is_operator,
    known,
    visible_to,
)

EXAMPLES_PER_GROUP = 5
#: Each event body, or a marker when it does not read (left out, logged, counted).
_BODY = event_row.lenient(audit_events.c.body)


def actor_of(caller: Any) -> dict[str, Any]:
    """The ``actor`` of a policy event: tenant and subject of who authenticated."""
    return {"tenant": caller.tenant, "subject": caller.subject,
            "principal_id": caller.principal_id, "kind": caller.kind}


# -- listing -----------------------------------------------------------------------------


def describe_policies(snapshot: PolicySnapshot, *, tenant: str | None = None,
                      state: dict[str, BundleState] | None = None) -> dict[str, Any]:
    """Bundles, their loaded versions (revision, engine, active/shadow) and load errors.

    ``tenant`` given (a tenant admin's view): only bundles that name or decide for that
    tenant, no filesystem paths, ``tenants`` cut to that tenant and ``"*"``. ``None``
    (an operator's view): everything, with paths and the stored state of each bundle.
    """
    bundles = []
    for bundle_id in sorted(set(snapshot.bundles) | set(snapshot.missing)):
        if tenant is not None and not visible_to(snapshot, tenant, bundle_id):
            continue
        owner = administrator(snapshot, bundle_id)
        entry: dict[str, Any] = {
            "id": bundle_id,
            "active": snapshot.active.get(bundle_id),
            "shadow": snapshot.shadow.get(bundle_id),
            "active_missing": bundle_id in snapshot.missing,
            "administered_by": "tenant" if owner is not None else "operator",
            "versions": [],
        }
        for version, bundle in sorted(snapshot.bundles.get(bundle_id, {}).items()):
            tenants = list(bundle.manifest.tenants)
            item: dict[str, Any] = {
                "version": version, "revision": bundle.revision,
                "engine": bundle.manifest.engine,
                "tenants": tenants if tenant is None
                else [t for t in tenants if t in {tenant, "*"}],
                "catalogue": bundle.catalogue is not None,
            }
            if tenant is None:
                item["path"] = str(bundle.path)
            entry["versions"].append(item)
        row = (state or {}).get(bundle_id)
        if tenant is None and row is not None:
            entry["state"] = {"active_version": row.active_version,
                              "active_revision": row.active_revision,
                              "shadow_version": row.shadow_version,
                              "generation": row.generation,
                              "changed_at": row.changed_at.isoformat(),
                              "changed_by": row.changed_by}
        bundles.append(entry)
    errors = [
        {"path": e.path, "message": e.message, "bundle_id": e.bundle_id, "version": e.version}
        if tenant is None else
        {"message": _strip_path(e.message, e.path), "bundle_id": e.bundle_id,
         "version": e.version}
        for e in snapshot.errors
        if tenant is None or (e.bundle_id and visible_to(snapshot, tenant, e.bundle_id))
    ]
    return {"bundles": bundles, "errors": errors}


def _strip_path(message: str, path: str) -> str:
    return message.replace(path, "<bundle>")


def list_policies(*, store: PolicyStore, caller: Any) -> dict[str, Any]:
    """:func:`describe_policies` as ``caller`` may see it (operator: everything)."""
    if is_operator(caller):
        return describe_policies(store.snapshot, state=store.state)
    if "admin" not in caller.roles:
        raise Forbidden("requires the role admin (or a system operator)")
    return describe_policies(store.snapshot, tenant=caller.tenant)


# -- authorisation -----------------------------------------------------------------------


def _refusal(snap: PolicySnapshot, caller: Any, bundle_id: str | None) -> CosignerError | None:
    if is_operator(caller):
        return None
    if "admin" not in caller.roles:
        return Forbidden("requires the role admin (or a system operator)")
    if bundle_id is None:
        return Forbidden("reloading reads this server's disk and changes every bundle: "
                         "a system operator's action", code="not_policy_admin")
    if not visible_to(snap, caller.tenant, bundle_id):
        return NotFound(f"no policy bundle {bundle_id!r} is loaded")
    if administrator(snap, bundle_id) != caller.tenant:
        return Forbidden(f"policy bundle {bundle_id!r} serves more than your tenant; a "
                         "system operator administers it", code="not_policy_admin")
    return None


async def authorize(*, store: PolicyStore, db: Database, caller: Any, now: Any,
                    action: str, bundle_id: str | None) -> None:
    """Refuse ``action`` on ``bundle_id`` (``None``: reload) unless ``caller`` may do it,
    recording the refusal (``policy.admin_refused``) in the caller's chain and in
    ``_system``. A refusal changes no decision, so no other tenant's chain gets it: that
    chain would otherwise name another tenant's admin and grow at their will; operators
    read every refusal in ``_system``.

    Raises:
        Forbidden: not an admin/operator (``forbidden``) or not this bundle's
            administrator (``not_policy_admin``).
        NotFound: the bundle neither names nor decides for the caller's tenant (as if it
            did not exist).
    """
    snap = store.snapshot
    refusal = _refusal(snap, caller, bundle_id)
    if refusal is None:
        return
    fanout = Fanout()
    event = Event(type="policy.admin_refused", actor=actor_of(caller),
                  payload={"action": action, "bundle_id": bundle_id, "code": refusal.code})
    async with db.transaction() as conn:
        # The actor's own chain and _system only: a refusal changes no decision, and a
        # tenant's chain never names another tenant's people nor grows at their will.
        fanout.add(event, {caller.tenant})
        await fanout.append(conn, now=now)
    raise refusal


# -- changes -----------------------------------------------------------------------------


def loaded_version(snap: PolicySnapshot, bundle_id: str, version: str) -> Any:
    if not known(snap, bundle_id):
        raise NotFound(f"no policy bundle {bundle_id!r} is loaded")
    bundle = snap.bundles.get(bundle_id, {}).get(version)
    if bundle is None:
        raise PolicyError(f"bundle {bundle_id} has no loaded version {version}",
                          code="unknown_policy_version")
    return bundle


def _ref(snap: PolicySnapshot, row: BundleState | None) -> dict[str, str] | None:
    if row is None:
        return None
    bundle = snap.active_bundle(row.bundle_id)
    if bundle is not None:
        return bundle.ref()
    return {"id": row.bundle_id, "version": row.active_version,
            "revision": row.active_revision}


async def _change_row(*, store: PolicyStore, db: Database, actor: dict[str, Any], now: Any,
                      bundle_id: str,
                      change: Callable[[BundleState | None], BundleState],
                      events: Callable[[PolicySnapshot, PolicySnapshot, BundleState | None,
                                        BundleState], list[Event]]) -> None:
    """Change one stored row and log it, in one transaction; then install the state."""
    async with change_lock(store):
        async with db.transaction() as conn:
            state = await read_state(conn, lock=True)
            previous = state.get(bundle_id)
            row = change(previous)
            await write_state(conn, row, previous)
            new_state = {**state, bundle_id: row}
            before, after = store.preview(state), store.preview(new_state)
            tenants = await affected_tenants(conn, [before, after], {bundle_id})
            fanout = Fanout()
            for event in events(before, after, previous, row):
                fanout.add(event, tenants, system_payload={"tenants": tenants})
            await fanout.append(conn, now=now)
        store.install(new_state)


def _next(previous: BundleState | None, actor: dict[str, Any], now: Any,
          **values: Any) -> BundleState:
    if previous is None:
        base = BundleState(bundle_id=values.pop("bundle_id"), active_version="",
                           active_revision="", active_tenants=(), shadow_version=None,
                           generation=0, changed_at=now, changed_by=actor)
    else:
        base = previous
        values.pop("bundle_id", None)
    return replace(base, generation=base.generation + 1, changed_at=now, changed_by=actor,
                   **values)


async def activate_version(*, store: PolicyStore, db: Database, caller: Any, now: Any,
                           bundle_id: str, version: str) -> dict[str, Any]:
    """Make ``version`` the active version of ``bundle_id`` on every replica (promote or
    roll back); stored, logged, then installed here.

    Raises:
        NotFound, Forbidden: see :func:`authorize`.
        PolicyError: ``unknown_policy_version`` (422) when that version is not loaded.
    """
    await authorize(store=store, db=db, caller=caller, now=now, action="activate",
                    bundle_id=bundle_id)
    bundle = loaded_version(store.snapshot, bundle_id, version)
    actor = actor_of(caller)

    def change(previous: BundleState | None) -> BundleState:
        shadow = previous.shadow_version if previous else None
        return _next(previous, actor, now, bundle_id=bundle_id, active_version=version,
                     active_revision=bundle.revision,
                     active_tenants=tuple(bundle.manifest.tenants),
                     shadow_version=None if shadow == version else shadow)

    def events(before: PolicySnapshot, after: PolicySnapshot, previous: BundleState | None,
               row: BundleState) -> list[Event]:
        return [Event(type="policy.activated", actor=actor, policy=bundle.ref(),
                      payload={"previous": _ref(before, previous),
                               "shadow": row.shadow_version})]

    await _change_row(store=store, db=db, actor=actor, now=now, bundle_id=bundle_id,
                      change=change, events=events)
    return list_policies(store=store, caller=caller)


async def shadow_version(*, store: PolicyStore, db: Database, caller: Any, now: Any,
                         bundle_id: str, version: str | None) -> dict[str, Any]:
    """Run ``version`` of ``bundle_id`` in shadow beside the active one on every replica
    (``None`` stops).

    Raises:
        NotFound, Forbidden: see :func:`authorize`. PolicyError: version not loaded.
    """
    await authorize(store=store, db=db, caller=caller, now=now, action="shadow",
                    bundle_id=bundle_id)
    shadow = loaded_version(store.snapshot, bundle_id, version) if version is not None else None
    actor = actor_of(caller)
    active = store.snapshot.active_bundle(bundle_id)

    def change(previous: BundleState | None) -> BundleState:
        if previous is None:  # never stored (its first activation failed): store it now
            if active is None:
                raise NotFound(f"policy bundle {bundle_id!r} has no active version")
            return _next(None, actor, now, bundle_id=bundle_id,
                         active_version=active.version, active_revision=active.revision,
                         active_tenants=tuple(active.manifest.tenants),
                         shadow_version=version)
        return _next(previous, actor, now, shadow_version=version)

    def events(before: PolicySnapshot, after: PolicySnapshot, previous: BundleState | None,
               row: BundleState) -> list[Event]:
        payload: dict[str, Any] = {"bundle_id": bundle_id, "active": row.active_version}
        if version is None:
            payload["stopped"] = previous.shadow_version if previous else None
        return [Event(type="policy.shadowed", actor=actor,
                      policy=shadow.ref() if shadow is not None else None, payload=payload)]

    await _change_row(store=store, db=db, actor=actor, now=now, bundle_id=bundle_id,
                      change=change, events=events)
    return list_policies(store=store, caller=caller)


async def reload_policies(*, store: PolicyStore, db: Database, caller: Any,
                          now: Any) -> dict[str, Any]:
    """Reload every bundle from this server's disk (operator only), refusing any that
    fails to compile or its own tests; store first activations and new revisions of
    active versions, and log it all. Returns the operator's :func:`describe_policies`.
    """
    await authorize(store=store, db=db, caller=caller, now=now, action="reload",
                    bundle_id=None)
    async with change_lock(store):
        old = store.snapshot
        await asyncio.to_thread(store.reload, check=check_bundle)
        await store_disk_state(store=store, db=db, actor=actor_of(caller), now=now, old=old,
                               operator_reload=True)
    return list_policies(store=store, caller=caller)


async def store_disk_state(*, store: PolicyStore, db: Database, actor: dict[str, Any],
                           now: Any, old: PolicySnapshot, operator_reload: bool) -> None:
    """After loading from disk (``old``: the snapshot before): store the first activation
    of each loaded bundle that has no stored state, log what was loaded and refused, and
    install the stored state. Call holding :func:`change_lock`.

    ``operator_reload``: an operator asked, so a new revision of a stored active version
    becomes the stored one (replicas follow) and refusals also go to the tenants of the
    refused bundle. At startup and when following, a different revision is only used and
    logged (a replica with older files must not overwrite the others' choice).
    """
    loaded = store.snapshot
    async with db.transaction() as conn:
        state = await read_state(conn, lock=True)
        new_state = dict(state)
        activated: list[tuple[str, BundleState | None]] = []
        raced = False
        for bundle_id, versions in sorted(loaded.bundles.items()):
            row = state.get(bundle_id)
            if row is None:
                bundle = versions[newest_version(versions)]
                first = _next(None, actor, now, bundle_id=bundle_id,
                              active_version=bundle.version, active_revision=bundle.revision,
                              active_tenants=tuple(bundle.manifest.tenants))
                if await insert_first(conn, first):
                    new_state[bundle_id] = first
                    activated.append((bundle_id, None))
                else:
                    raced = True
            elif operator_reload and row.active_version in versions \
                    and versions[row.active_version].revision != row.active_revision:
                bundle = versions[row.active_version]
                new_state[bundle_id] = _next(row, actor, now,
                                             active_revision=bundle.revision,
                                             active_tenants=tuple(bundle.manifest.tenants))
                await write_state(conn, new_state[bundle_id], row)
                activated.append((bundle_id, row))
        if raced:  # another replica stored a first activation meanwhile: use its row
            new_state = await read_state(conn)
        before, after = store.preview(state), store.preview(new_state)
        fanout = Fanout()
        _loaded_events(fanout, old, loaded, actor)
        for error in loaded.errors:
            tenants = (await affected_tenants(conn, [after], {error.bundle_id})
                       if operator_reload and error.bundle_id else [])
            fanout.add(Event(type="policy.refused", actor=actor,
                             payload={"message": _strip_path(error.message[:2000], error.path),
                                      "bundle_id": error.bundle_id,
                                      "version": error.version}),
                       tenants, system_payload={"path": error.path,
                                                "message": error.message[:2000]})
        for bundle_id, previous in activated:
            active = after.active_bundle(bundle_id)
            tenants = await affected_tenants(conn, [before, after], {bundle_id})
            fanout.add(Event(type="policy.activated", actor=actor,
                             policy=active.ref() if active else None,
                             payload={"previous": _ref(before, previous),
                                      "first": previous is None}),
                       tenants, system_payload={"tenants": tenants})
        await fanout.append(conn, now=now)
    store.install(new_state)


def _loaded_events(fanout: Fanout, old: PolicySnapshot, new: PolicySnapshot,
                   actor: dict[str, Any]) -> None:
    """``policy.loaded`` (``_system`` only: it carries paths) for each version new in
    ``new`` or with a new revision."""
    for bundle_id, versions in sorted(new.bundles.items()):
        for version, bundle in sorted(versions.items()):
            before = old.bundles.get(bundle_id, {}).get(version)
            if before is None or before.revision != bundle.revision:
                fanout.add(Event(type="policy.loaded", actor=actor, policy=bundle.ref(),
                                 payload={"path": str(bundle.path),
                                          "engine": bundle.manifest.engine,
                                          "tenants": list(bundle.manifest.tenants)}), [])


# -- shadow report -------------------------------------------------------------------------


async def shadow_report(*, store: PolicyStore, db: Database, caller: Any,
                        bundle_id: str) -> dict[str, Any]:
    """Disagreements between the active and shadow versions of ``bundle_id`` in the
    caller's decision log (an operator: every tenant's): totals, counts by tool and by
    (active → shadow) effect, and up to :data:`EXAMPLES_PER_GROUP` example decision ids
    per group. A tenant admin gets 404 for a bundle that is not theirs to see.

    A decision whose event does not read back (rows deleted or damaged outside Cosigner)
    is left out of the comparison, logged, and counted: ``unreadable: {count, examples}``
    (decision ids from the events' rows)."""
    operator = is_operator(caller)
    if not operator:
        if "admin" not in caller.roles:
            raise Forbidden("requires the role admin (or a system operator)")
        if not visible_to(store.snapshot, caller.tenant, bundle_id):
            raise NotFound(f"no policy bundle {bundle_id!r} is loaded")
    query = (select(audit_events.c.tenant, audit_events.c.seq, audit_events.c.decision_id,
                    audit_events.c.tool, _BODY)
             .where(audit_events.c.type == "decision.made",
                    audit_events.c.policy_id == bundle_id)
             .order_by(audit_events.c.tenant, audit_events.c.seq))
    if not operator:
        query = query.where(audit_events.c.tenant == caller.tenant)
    async with db.read() as conn:
        rows = (await conn.execute(query)).all()
    compared = 0
    by_tool: Counter[str] = Counter()
    by_effect: Counter[str] = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    shadow_versions: set[str] = set()
    unreadable: list[str] = []
    for row in rows:
        body = event_row.readable(row.body, tenant=row.tenant, seq=int(row.seq),
                                  reader="a shadow report")
        if body is None:
            unreadable.append(row.decision_id)
            continue
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
        "unreadable": {"count": len(unreadable),
                       "examples": unreadable[:EXAMPLES_PER_GROUP]},
    }

