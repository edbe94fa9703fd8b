"""One poll loop per process that follows the state replicas share (issue 13).

Every ``replica_poll_s`` it reads the generations of ``replica_generations`` in one query
and hands each to its follower: the keyring (:class:`cosigner.keys.store.KeyringFollower`)
and the API-key cache (:class:`cosigner.identity.principals.KeyAuthenticator`). A change
committed on any process is therefore followed here within ``replica_poll_s`` plus one
query. A failed
poll is logged and retried; meanwhile the API-key cache stops answering (its freshness
lapses after two intervals), so credentials are checked against the database.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from cosigner.core.clock import Clock
from cosigner.db import generations
from cosigner.db.database import Database

log = logging.getLogger("cosigner.replicas")

Follower = Callable[[int, datetime], Awaitable[None]]


class ReplicaSync:
    """Polls the shared generations and calls each follower with its own (the loop that
    calls :meth:`poll` every ``replica_poll_s`` is :class:`cosigner.tasks.Tasks`)."""

    def __init__(self, db: Database, *, clock: Clock) -> None:
        self._db = db
        self._clock = clock
        self._followers: dict[str, Follower] = {}

    def follow(self, name: str, follower: Follower) -> None:
        """Call ``follower(generation, now)`` on every poll of generation ``name``."""
        self._followers[name] = follower

    async def poll(self) -> None:
        """Read the generations once and call the followers.

        Raises:
            Unavailable: the database cannot be reached.
        """
        current = await generations.read_all(self._db)
        now = self._clock()
        for name, follower in self._followers.items():
            await follower(current.get(name, 0), now)
