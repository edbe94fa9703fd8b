"""Every replica follows the stored policy state (issue 13).

At start the follower stores the first activation of each loaded bundle that was never
activated, logs what this process loaded, and installs the stored state. Then it polls
``policy_state`` every ``policy_poll_interval_ms``: one statement reads each row's
``generation`` (:func:`cosigner.db.polls.poll_rows`); only when one moved does it read the
rows and install the new state (one atomic snapshot swap). When the state names a version (or
revision) this process has not loaded, it first reloads its own disk once for that
state (another replica was reloaded with new files); a version still not there leaves
that bundle's tenants denied ``policy_not_loaded`` and is logged as an error.

So a change made on one replica decides on every other one at most one poll interval
plus one query after its commit (plus the disk reload, when one is needed).
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import select

from cosigner.audit.system import SYSTEM_ACTOR
from cosigner.core.clock import Clock
from cosigner.core.errors import CosignerError
from cosigner.core.roles import SYSTEM_TENANT
from cosigner.db.database import Database
from cosigner.db.polls import poll_rows
from cosigner.db.raw_sql import RawStatement
from cosigner.db.tables_policy import policy_state
from cosigner.policy.admin import store_disk_state
from cosigner.policy.cases import check_bundle
from cosigner.policy.state import BundleState, change_lock, fingerprint, read_state
from cosigner.policy.store import PolicySnapshot, PolicyStore

log = logging.getLogger("cosigner.policy")

#: The actor of first activations and of what a process loads: this server itself.
ACTOR = {**SYSTEM_ACTOR, "tenant": SYSTEM_TENANT}

#: What a poll reads: the state's fingerprint (:func:`cosigner.policy.state.fingerprint`).
_GENERATIONS = RawStatement(select(policy_state.c.bundle_id, policy_state.c.generation))


def needs_disk(snap: PolicySnapshot, state: dict[str, BundleState]) -> bool:
    """Whether ``state`` names a version or revision of a present bundle that ``snap``
    has not loaded."""
    for bundle_id, row in state.items():
        versions = snap.bundles.get(bundle_id)
        if versions is None:
            continue
        bundle = versions.get(row.active_version)
        if bundle is None or bundle.revision != row.active_revision:
            return True
        if row.shadow_version is not None and row.shadow_version not in versions:
            return True
    return False


class PolicyFollower:
    """Start-up sync (:meth:`first_sync`) plus one poll (:meth:`sync`), called every
    ``policy_poll_interval_ms`` by :class:`cosigner.tasks.Tasks`."""

    def __init__(self, store: PolicyStore, db: Database, clock: Clock) -> None:
        self.store = store
        self.db = db
        self.clock = clock
        self._applied: dict[str, int] | None = None
        self._reloaded_for: dict[str, int] | None = None
        self._reported: set[tuple[str, str, str]] = set()

    async def first_sync(self) -> None:
        """Sync once at start (an unavailable database is logged: nothing is active until
        a later :meth:`sync` reaches it, so decisions deny)."""
        try:
            async with change_lock(self.store):
                await store_disk_state(store=self.store, db=self.db, actor=ACTOR,
                                       now=self.clock(), old=PolicySnapshot(),
                                       operator_reload=False)
            self._applied = fingerprint(self.store.state or {})
            self._report()
        except CosignerError as exc:
            log.error("could not read the policy state; no policy is active until it can "
                      "be read: %s", exc.detail)

    async def sync(self) -> bool:
        """Install the stored state if it changed; True when it did. An unchanged state
        costs one statement (the generations).

        Raises:
            Unavailable ``storage_unavailable``: the database cannot be read.
        """
        if self._applied is not None and {
                bundle_id: int(generation) for bundle_id, generation
                in await poll_rows(self.db, _GENERATIONS)} == self._applied:
            return False
        async with self.db.read() as conn:
            state = await read_state(conn)
        seen = fingerprint(state)
        if seen == self._applied:
            return False
        async with change_lock(self.store):
            if self.store.state is None or (needs_disk(self.store.snapshot, state)
                                            and seen != self._reloaded_for):
                self._reloaded_for = seen
                # Never synced (the database was down at start): log everything loaded.
                old = PolicySnapshot() if self.store.state is None else self.store.snapshot
                await asyncio.to_thread(self.store.reload, check=check_bundle)
                await store_disk_state(store=self.store, db=self.db, actor=ACTOR,
                                       now=self.clock(), old=old,
                                       operator_reload=False)
            else:
                self.store.install(state)
        self._applied = fingerprint(self.store.state or {})
        self._report()
        return True

    def _report(self) -> None:
        """Log, once per process, each stored version this process decides without."""
        snap = self.store.snapshot
        for bundle_id, row in sorted((self.store.state or {}).items()):
            versions = snap.bundles.get(bundle_id, {})
            bundle = versions.get(row.active_version)
            if bundle_id in snap.missing:
                problem = ("missing", "is not loaded: its tenants are denied "
                           "policy_not_loaded until it is on disk and reloaded, or another "
                           "version is activated")
            elif bundle is not None and bundle.revision != row.active_revision:
                problem = (bundle.revision, f"is on disk with another revision, "
                           f"{bundle.revision}: deciding with that one")
            elif not versions and not any(e.bundle_id == bundle_id for e in snap.errors):
                problem = ("absent", "is not loaded and no version of the bundle is on this "
                           "server's disk: the bundle decides nothing here")
            else:
                continue
            key = (bundle_id, row.active_version, problem[0])
            if key not in self._reported:
                self._reported.add(key)
                log.error("policy bundle %s: the stored active version %s (revision %s) %s",
                          bundle_id, row.active_version, row.active_revision, problem[1])
