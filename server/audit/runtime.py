"""The audit area's part of the app lifespan: startup events and the checkpoint task."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from server.audit.checkpoints import Checkpointer
from server.audit.system import record_keyring
from server.decisions import Deps
from server.errors import CosignerError

log = logging.getLogger("cosigner.audit")


class AuditRuntime:
    """Records the signing keys this process loaded and signs checkpoints until stopped
    (policy load events: :mod:`server.policy.follower`)."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.checkpointer = Checkpointer(
            deps.db, deps.keyring, deps.clock,
            every_events=deps.settings.checkpoint_every_events,
            every_s=deps.settings.checkpoint_every_s)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Record startup events (best effort: an unavailable database is logged, and
        /readyz reports it) and start the checkpoint task."""
        now = self.deps.clock()
        try:
            await record_keyring(self.deps.db, self.deps.keyring, now=now)
        except CosignerError as exc:
            log.error("could not record startup audit events: %s", exc.detail)
        self._task = asyncio.create_task(self.checkpointer.run(), name="audit-checkpoints")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
