"""Group commit: many concurrent writers, one transaction per batch.

Each request hands its write to :meth:`GroupCommitter.submit` and waits; one drain task
takes up to ``max_batch`` queued items (waiting at most ``max_wait_s`` for more once the
first arrives, but only while other writes are in flight: see below), runs
``run_batch(items)`` — one transaction, one COMMIT — and only then resolves each waiter
with its own result or error. So throughput is not bounded by one fsync per decision,
and no request is acknowledged before the COMMIT that holds its write (DESIGN
invariant 2). If the batch fails as a whole, every waiter in it gets
:class:`cosigner.core.errors.Unavailable` (HTTP 503, treated as deny) — never a hang,
never an acknowledgement. The same holds when the drain task itself ends, wherever it
waits (cancelled at loop shutdown, or a fault of its own): its batch and every queued
item get ``Unavailable``, and later submits are refused at once (tests/db/
test_group_commit.py). :meth:`GroupCommitter.stop` first lets it finish what is queued.

Bounded and fair: the queue holds at most ``max_queue`` items, and one fairness ``key``
(the tenant) at most ``max_queue_per_key`` of them; past either bound ``submit`` raises
:class:`cosigner.core.errors.Overloaded` (503 ``overloaded``, ``Retry-After``) at once and
reports the shed to :class:`cosigner.core.load.Shedding`, so nothing waits without bound
and a flooding tenant is refused while another tenant still gets in. Each key has its own
FIFO and a batch is filled round-robin over the keys with work, so a tenant with one
queued decision waits for at most one batch, however many the flooding tenant queued.

Gathering only with siblings (PostgreSQL's ``commit_delay`` with ``commit_siblings``):
a batch waits for more items only when it already holds several, or when some item
arrived while the previous batch was gathering or committing — i.e. when other writers
were in flight at the same time. A lone request (one client, or a quiet moment) is
committed at once instead of paying ``max_wait_s``; under concurrency batches form as
before. The signal lasts one batch: a batch during which nothing arrived lets the next
one commit at once again.

Gathering only while it brings company: a batch that already holds several items but
saw nothing arrive during the previous batch waits only if the last wait it could have
taken brought at least one item. When every in-flight writer is already in the batch
(clients in lockstep: all of them answered by one COMMIT, all back before the drain task
runs again), the timer can only idle the event loop: at c=16 in process that was
``max_wait_s`` (1 ms) per batch of 16, a sixth of the wall time (bench/README.md,
"Session 10: pipelining the COMMIT"). One fruitless wait turns this branch off; an item
arriving while a batch gathers or commits (the first rule) turns gathering on again, and
a wait that brings an item keeps the second rule on.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from cosigner.core import tracing
from cosigner.core.errors import CosignerError, Overloaded, Unavailable
from cosigner.core.load import Shedding
from cosigner.core.metrics import metrics

log = logging.getLogger("cosigner.db.group_commit")

I = TypeVar("I")  # noqa: E741 - item type
R = TypeVar("R")

#: ``run_batch(items)`` → one outcome per item, in order: a result or the exception for it.
BatchRunner = Callable[[list[I]], Awaitable[list[Any]]]


@dataclass(slots=True)
class _Pending(Generic[I]):
    item: I
    future: asyncio.Future[Any] = field(repr=False)
    queued_at: float = 0.0
    #: Size of the batch that committed it (the durable-write span's attribute).
    batch: int = 0


@dataclass
class GroupCommitStats:
    batches: int = 0
    items: int = 0
    failed_batches: int = 0
    largest_batch: int = 0


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class GroupCommitter(Generic[I]):
    """Queue writes and commit them in batches (sizes, waits and queue bounded by settings)."""

    def __init__(self, run_batch: BatchRunner[I], *, max_batch: int = 64,
                 max_wait_s: float = 0.002, max_queue: int = 10_000,
                 max_queue_per_key: int | None = None, shedding: Shedding | None = None,
                 name: str = "log_writer") -> None:
        self._run_batch = run_batch
        m = metrics()
        self._batch_size = m.batch_size[(name,)]
        self._batch_wait = m.batch_wait[(name,)]
        self._failures = m.log_write_failures[(name,)]
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._max_queue = max_queue
        self._max_per_key = max_queue_per_key or max(1, max_queue // 2)
        self._shedding = shedding or Shedding()
        self._name = name
        self._queues: dict[str, deque[_Pending[I]]] = {}
        self._turns: deque[str] = deque()  # keys with queued items, in round-robin order
        self._size = 0
        self._busy = False
        #: An item arrived while a batch was gathering or committing (see the module doc).
        self._siblings = False
        #: The last gather brought at least one item (see the module doc).
        self._fruitful = True
        self._arrived = asyncio.Event()
        #: While a batch gathers: resolved when the queue can fill it (see _gather).
        self._filled: asyncio.Future[None] | None = None
        self._room = 0
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.stats = GroupCommitStats()

    @property
    def depth(self) -> int:
        """Items queued and not yet in a batch."""
        return self._size

    @property
    def running(self) -> bool:
        """The drain task runs and takes submits: False before :meth:`start`, after
        :meth:`stop`, and once the task ended on a fault (every submit is then refused
        with 503 until the process restarts: ``/healthz`` and ``/readyz`` say so)."""
        task = self._task
        return not self._closed and task is not None and not task.done()

    def start(self) -> None:
        """Start the drain task on the running loop."""
        if self._task is None:
            self._arrived = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._drain(),
                                                                name="group-commit")

    async def stop(self) -> None:
        """Finish what is queued, then stop; later submits get Unavailable."""
        self._closed = True
        if self._task is not None:
            while (self._size or self._busy) and not self._task.done():
                await asyncio.sleep(0.005)
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def submit(self, item: I, *, key: str = "") -> Any:
        """Queue ``item`` under fairness ``key`` (the tenant) and wait until the batch
        holding it committed.

        Returns the item's result. Raises the item's own :class:`CosignerError`,
        :class:`Overloaded` at once when the queue or the key's share of it is full, or
        :class:`Unavailable` when the batch could not be committed or the committer is
        stopped.
        """
        if self._closed or self._task is None or self._task.done():
            raise Unavailable("the decision log writer is not running",
                              code="storage_unavailable")
        queue = self._queues.get(key)
        if self._size >= self._max_queue or (queue is not None
                                             and len(queue) >= self._max_per_key):
            self._failures.inc()
            raise self._overloaded()
        loop = asyncio.get_running_loop()
        pending: _Pending[I] = _Pending(item, loop.create_future(), loop.time())
        if queue is None:
            queue = self._queues[key] = deque()
            self._turns.append(key)
        queue.append(pending)
        self._size += 1
        if self._busy:
            self._siblings = True
        filled = self._filled
        if filled is None:
            self._arrived.set()
        elif self._size >= self._room and not filled.done():
            filled.set_result(None)
        if not tracing.enabled():
            return await pending.future
        with tracing.span("decision_log.write") as current:
            try:
                return await pending.future
            finally:
                tracing.set_attributes(current, {"cosigner.batch_size": pending.batch})

    def _overloaded(self) -> Overloaded:
        return self._shedding.shed(self._name, f"the {self._name.replace('_', ' ')} queue "
                                   "is full; retry later")

    def _take(self, batch: list[_Pending[I]]) -> None:
        """Move queued items into ``batch``, one per key in turn, up to ``max_batch``."""
        while self._size and len(batch) < self._max_batch:
            key = self._turns.popleft()
            queue = self._queues[key]
            batch.append(queue.popleft())
            self._size -= 1
            if queue:
                self._turns.append(key)
            else:
                del self._queues[key]

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        batch: list[_Pending[I]] = []
        try:
            while True:
                while not self._size:
                    self._arrived.clear()
                    await self._arrived.wait()
                batch = []
                self._busy = True
                try:
                    self._take(batch)
                    siblings = self._siblings or (len(batch) > 1 and self._fruitful)
                    self._siblings = False
                    if siblings and len(batch) < self._max_batch and self._max_wait_s > 0:
                        before = len(batch)
                        await self._gather(loop, self._max_batch - len(batch))
                        self._take(batch)
                        self._fruitful = len(batch) > before
                    await self._commit(batch)
                finally:
                    self._busy = False
        except BaseException as exc:
            # Cancelled (loop shutdown, stop) or broken at any await point — waiting,
            # gathering or committing: the batch in hand and everything still queued are
            # answered 503, never left waiting nor acknowledged; later submits are
            # refused (the task is done).
            self._closed = True
            stopped = Unavailable("the decision log writer stopped",
                                  code="storage_unavailable")
            self._fail(batch, stopped)
            self._fail_queued(stopped)
            if not isinstance(exc, Exception):  # cancelled, GeneratorExit, interrupts
                raise
            log.error("group commit writer failed: %s: %s", type(exc).__name__, exc)

    async def _gather(self, loop: asyncio.AbstractEventLoop, room: int) -> None:
        """Wait ``max_wait_s`` for more items, or less once ``room`` more are queued: one
        timer and one future per batch (arrivals do not wake the drain task one by one)."""
        if self._size >= room:
            return
        filled = self._filled = loop.create_future()
        self._room = room
        timer = loop.call_later(self._max_wait_s, _resolve, filled)
        try:
            await filled
        finally:
            timer.cancel()
            self._filled = None

    async def _commit(self, batch: list[_Pending[I]]) -> None:
        self.stats.batches += 1
        self.stats.items += len(batch)
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
        try:
            outcomes = await self._run_batch([p.item for p in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError("run_batch returned the wrong number of outcomes")
            self._batch_size.observe(len(batch))
            self._batch_wait.observe(asyncio.get_running_loop().time() - batch[0].queued_at)
            for pending in batch:
                pending.batch = len(batch)
        except Exception as exc:  # noqa: BLE001 - any batch fault fails its waiters closed
            self.stats.failed_batches += 1
            self._failures.inc(len(batch))
            if not isinstance(exc, Unavailable):
                log.error("group commit batch failed: %s: %s", type(exc).__name__, exc)
                exc = Unavailable("the decision could not be recorded",
                                  code="storage_unavailable")
            self._fail(batch, exc)
            return
        for pending, outcome in zip(batch, outcomes, strict=True):
            if pending.future.done():
                continue
            if isinstance(outcome, BaseException):
                pending.future.set_exception(outcome)
            else:
                pending.future.set_result(outcome)

    def _fail_queued(self, exc: CosignerError) -> None:
        """Answer ``exc`` to every item still queued (not taken into a batch)."""
        queues, self._queues = self._queues, {}
        self._turns.clear()
        self._size = 0
        for queue in queues.values():
            self._fail(list(queue), exc)

    @staticmethod
    def _fail(batch: list[_Pending[I]], exc: CosignerError) -> None:
        for pending in batch:
            if not pending.future.done():
                pending.future.set_exception(exc)
