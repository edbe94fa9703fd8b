"""Background loops of one process, started and stopped in one place.

* the replica sync: one poll of the generations replicas share
  (:mod:`cosigner.db.replica_sync`) keeps the keyring and the API-key cache in step with
  what other processes and the CLI changed;
* the decision-log and refusal writers (group committers, :mod:`cosigner.db.group_commit`);
* the approval expiry sweep: every ``settings.sweep_every_s`` due requests move to
  ``expired`` (expiry does not depend on it – reviews and reads expire a due request
  themselves – but the log then shows expiries nobody looked at); a round with nothing
  due is one statement (:func:`cosigner.db.polls.poll_rows`);
* the policy follower: the stored active/shadow versions (:mod:`cosigner.policy.follower`,
  which also records what this process loaded);
* the audit checkpointer (signed checkpoints) and the keyring's startup events;
* the webhook delivery worker, when any receiver is configured (it also counts the
  backlog that bounds new approval requests);
* the totals of rate-limit refusals per ended window (:meth:`Quotas.flush`);
* the Slack message sync, when any tenant has Slack configured
  (:mod:`cosigner.slack.messages`: posts new requests, updates decided ones).

:meth:`Tasks.stop` stops them in reverse order; each loop is cancelled and awaited by one
helper, so a loop never outlives the app that started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from cosigner.approvals.requests import ANY_DUE, expire_due
from cosigner.audit.checkpoints import Checkpointer
from cosigner.audit.system import record_keyring
from cosigner.context import AppContext
from cosigner.core.errors import CosignerError
from cosigner.db import generations
from cosigner.db.polls import poll_rows
from cosigner.db.replica_sync import ReplicaSync
from cosigner.keys.store import KeyringFollower
from cosigner.policy.follower import PolicyFollower

if TYPE_CHECKING:  # imported below when configured (idle memory, issue 20)
    from cosigner.slack.messages import MessageSync
    from cosigner.webhooks.worker import WebhookWorker

log = logging.getLogger("cosigner.tasks")


class Tasks:
    """The process's background work for one :class:`AppContext`."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        settings = ctx.settings
        self.checkpointer = Checkpointer(
            ctx.db, ctx.keyring, ctx.clock,
            every_events=settings.checkpoint_every_events, every_s=settings.checkpoint_every_s)
        self.webhook_worker: WebhookWorker | None = None
        if settings.webhooks:
            from cosigner.webhooks.worker import WebhookWorker

            self.webhook_worker = WebhookWorker(ctx.db, settings, ctx.clock,
                                                backlog=ctx.webhook_backlog)
        self.slack_sync: MessageSync | None = None
        if settings.slack:
            from cosigner.slack.messages import MessageSync

            self.slack_sync = MessageSync(ctx.db, settings, ctx.clock)
        self._loops: list[asyncio.Task[None]] = []
        self.policy_follower = PolicyFollower(ctx.store, ctx.db, ctx.clock)
        self.replica_sync = ReplicaSync(ctx.db, clock=ctx.clock)
        self.replica_sync.follow(
            generations.SIGNING_KEYS,
            KeyringFollower(ctx.key_store, ctx.keyring, ctx.clock).observe)
        fresh_for_s = 2 * settings.replica_poll_s

        async def follow_credentials(generation: int, _now: object) -> None:
            ctx.authenticator.observe(generation, fresh_for_s=fresh_for_s)

        self.replica_sync.follow(generations.CREDENTIALS, follow_credentials)

    async def start(self) -> None:
        """Follow the shared state (one poll first: a process must not start blind), start
        the writers, record what this process loaded, start every loop."""
        settings = self.ctx.settings
        await self.replica_sync.poll()  # errors propagate: no start without the shared state
        self._every("replica-sync", settings.replica_poll_s, self.replica_sync.poll)
        self.ctx.log_writer.start()
        self.ctx.refusals.start()
        await self.policy_follower.first_sync()
        self._every("policy-follower", settings.policy_poll_interval_ms / 1000,
                    self.policy_follower.sync)
        await self._record_startup()
        self._every("approval-sweeper", settings.sweep_every_s, self._sweep_once)
        self._loops.append(asyncio.create_task(self.checkpointer.run(), name="audit-checkpoints"))
        self._every("quota-refusals", max(1.0, settings.rate_limit_log_window_s / 4),
                    self.ctx.quotas.flush)
        if self.webhook_worker is not None:
            self.webhook_worker.start()
        if self.slack_sync is not None:
            self._every("slack-sync", settings.slack_poll_s, self.slack_sync.run_once)

    async def stop(self) -> None:
        """Stop every loop (cancel and await), then drain and stop the writers."""
        for task in reversed(self._loops):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._loops.clear()
        with contextlib.suppress(CosignerError):
            await self.ctx.quotas.flush(everything=True)
        await self.ctx.refusals.stop()
        await self.ctx.log_writer.stop()
        if self.webhook_worker is not None:
            await self.webhook_worker.stop()

    async def _record_startup(self) -> None:
        """Record the keyring (best effort: an unavailable database is logged, and /readyz
        reports it)."""
        now = self.ctx.clock()
        try:
            await record_keyring(self.ctx.db, self.ctx.keyring, now=now)
        except CosignerError as exc:
            log.error("could not record startup audit events: %s", exc.detail)

    def _every(self, name: str, interval_s: float,
               step: Callable[[], Awaitable[object]]) -> None:
        """Run ``step`` every ``interval_s`` seconds until :meth:`stop`. A failure is logged
        and the next round tries again (storage down: a warning; anything else, a bug: the
        traceback), so no loop ends silently."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await step()
                except CosignerError as exc:
                    log.warning("%s failed: %s", name, exc.detail)
                except Exception:
                    log.exception("%s failed", name)

        self._loops.append(asyncio.create_task(loop(), name=name))

    async def _sweep_once(self) -> None:
        now = self.ctx.clock()
        if not await poll_rows(self.ctx.db, ANY_DUE, {"now": now}):
            return
        count = await expire_due(self.ctx.db, now, settings=self.ctx.settings)
        if count:
            log.info("ended %d approval stages (expired or escalated)", count)
