"""The approvals area's part of the app lifespan.

* the expiry sweep: every ``settings.sweep_every_s`` due requests move to ``expired`` (expiry
  does not depend on it – reviews and reads expire a due request themselves – but the log
  then shows expiries nobody looked at);
* the permit-refusal writer: refused redeems are logged through a
  :class:`cosigner.db.group_commit.GroupCommitter`, so a storm of replays or concurrent
  redeems costs one commit per batch instead of one per refusal, and each refusal is still
  durable before its response.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cosigner.approvals.reviews import expire_due
from cosigner.audit.chain import Event, append
from cosigner.core.errors import CosignerError
from cosigner.db.group_commit import GroupCommitter

if TYPE_CHECKING:
    from cosigner.db.database import Database
    from cosigner.decisions.pdp import Deps

log = logging.getLogger("cosigner.approvals")

#: ``(tenant, event, now)`` of one refusal to log.
Refusal = tuple[str, Event, datetime]


def refusal_writer(db: Database) -> GroupCommitter[Refusal]:
    """A group committer appending each batch of refusal events in one transaction."""

    async def run_batch(items: list[Refusal]) -> list[Any]:
        # Tenant heads are locked in one global order (sorted, as the decision log writer
        # does), so this batch and a concurrent decision batch never wait on each other in
        # a cycle (PostgreSQL would abort one: 503). Per tenant, events keep arrival order.
        async with db.transaction() as conn:
            for tenant, event, now in sorted(items, key=lambda item: item[0]):
                await append(conn, tenant, [event], now=now)
        return [None] * len(items)

    return GroupCommitter(run_batch)


class ApprovalRuntime:
    """Start in the app lifespan, stop on shutdown."""

    def __init__(self, deps: Deps) -> None:
        self._deps = deps
        self._task: asyncio.Task[None] | None = None
        self.refusals = refusal_writer(deps.db)

    async def start(self) -> None:
        self.refusals.start()
        self._task = asyncio.create_task(self._sweep(), name="approval-sweeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.refusals.stop()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self._deps.settings.sweep_every_s)
            try:
                count = await expire_due(self._deps.db, self._deps.clock())
                if count:
                    log.info("expired %d approval requests", count)
            except CosignerError as exc:  # storage down: try again next round
                log.warning("approval sweep failed: %s", exc.detail)
