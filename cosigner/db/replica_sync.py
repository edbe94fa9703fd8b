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

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from cosigner.core.clock import Clock
from cosigner.core.errors import CosignerError
from cosigner.db import generations
from cosigner.db.database import Database

log = logging.getLogger("cosigner.replicas")

Follower = Callable[[int, datetime], Awaitable[None]]


class ReplicaSync:
    """Polls the shared generations and calls each follower with its own."""

    def __init__(self, db: Database, *, interval_s: float, clock: Clock) -> None:
        self._db = db
        self._interval_s = interval_s
        self._clock = clock
        self._followers: dict[str, Follower] = {}
        self._task: asyncio.Task[None] | None = None

    def follow(self, name: str, follower: Follower) -> None:
        """Call ``follower(generation, now)`` on every poll of generation ``name``."""
        self._followers[name] = follower

    async def poll(self) -> None:
        """Read the generations once and call the followers.

        Raises:
            Unavailable: the database cannot be reached.
        """
        async with self._db.read() as conn:
            current = await generations.read_all(conn)
        now = self._clock()
        for name, follower in self._followers.items():
            await follower(current.get(name, 0), now)

    async def start(self) -> None:
        """Poll once (errors propagate: the process must not start blind), then loop."""
        await self.poll()
        self._task = asyncio.create_task(self._run(), name="replica-sync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.poll()
            except CosignerError as exc:
                log.warning("could not read shared state: %s", exc.detail)
            except Exception:  # a follower's bug must not end the loop silently
                log.exception("replica sync poll failed")
