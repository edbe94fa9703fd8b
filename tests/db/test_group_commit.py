"""GroupCommitter: batching, per-item outcomes, whole-batch failure fails closed."""

from __future__ import annotations

import asyncio

import pytest

from cosigner.core.errors import Conflict, Overloaded, Unavailable
from cosigner.core.load import Shedding
from cosigner.db.group_commit import GroupCommitter


async def test_concurrent_submits_share_batches_and_get_their_own_results() -> None:
    batches: list[list[int]] = []

    async def run(items: list[int]) -> list[object]:
        batches.append(items)
        await asyncio.sleep(0.01)  # a slow COMMIT lets the queue fill up
        return [i * 10 for i in items]

    committer: GroupCommitter[int] = GroupCommitter(run, max_batch=8, max_wait_s=0.001)
    committer.start()
    results = await asyncio.gather(*(committer.submit(i) for i in range(40)))
    await committer.stop()
    assert results == [i * 10 for i in range(40)]
    assert sum(len(b) for b in batches) == 40
    assert max(len(b) for b in batches) <= 8
    assert len(batches) < 40  # really grouped


async def test_an_item_error_is_that_items_only() -> None:
    async def run(items: list[int]) -> list[object]:
        return [Conflict("dup") if i == 3 else i for i in items]

    committer: GroupCommitter[int] = GroupCommitter(run, max_batch=16, max_wait_s=0.005)
    committer.start()
    outcomes = await asyncio.gather(*(committer.submit(i) for i in range(6)),
                                    return_exceptions=True)
    await committer.stop()
    assert [type(o).__name__ for o in outcomes] == ["int"] * 3 + ["Conflict"] + ["int"] * 2


async def test_batch_failure_fails_every_waiter_closed() -> None:
    async def run(items: list[int]) -> list[object]:
        raise OSError("disk full")

    committer: GroupCommitter[int] = GroupCommitter(run, max_batch=16, max_wait_s=0.005)
    committer.start()
    outcomes = await asyncio.gather(*(committer.submit(i) for i in range(5)),
                                    return_exceptions=True)
    assert all(isinstance(o, Unavailable) for o in outcomes)
    assert committer.stats.failed_batches >= 1
    # The writer keeps serving after a failed batch.
    committer._run_batch = lambda items: _echo(items)  # type: ignore[assignment]
    assert await committer.submit(7) == 7
    await committer.stop()


async def _echo(items: list[int]) -> list[object]:
    return list(items)


async def test_submit_after_stop_is_unavailable() -> None:
    committer: GroupCommitter[int] = GroupCommitter(_echo)
    committer.start()
    await committer.stop()
    with pytest.raises(Unavailable):
        await committer.submit(1)


async def test_bounds_shed_at_once_and_batches_take_tenants_in_turn() -> None:
    release = asyncio.Event()
    batches: list[list[str]] = []

    async def run(items: list[str]) -> list[object]:
        batches.append(items)
        await release.wait()
        return list(items)

    shedding = Shedding()
    committer: GroupCommitter[str] = GroupCommitter(
        run, max_batch=3, max_wait_s=0, max_queue=5, max_queue_per_key=3,
        shedding=shedding)
    committer.start()
    waiting = [asyncio.create_task(committer.submit("a0", key="a"))]
    while not batches:  # a0 is in the first batch, waiting on its COMMIT
        await asyncio.sleep(0)
    waiting += [asyncio.create_task(committer.submit(f"a{i}", key="a")) for i in (1, 2, 3)]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded):  # tenant a holds its share (3) of the queue
        await committer.submit("a4", key="a")
    waiting += [asyncio.create_task(committer.submit(f"b{i}", key="b")) for i in (0, 1)]
    await asyncio.sleep(0)
    assert committer.depth == 5
    with pytest.raises(Overloaded) as full:  # the queue is full for everyone
        await committer.submit("c0", key="c")
    assert full.value.code == "overloaded" and full.value.extra["retry_after"] >= 1
    assert shedding.counts == {"log_writer": 2} and shedding.overloaded() == ["log_writer"]
    release.set()
    assert await asyncio.gather(*waiting) == ["a0", "a1", "a2", "a3", "b0", "b1"]
    await committer.stop()
    # Round-robin: b0 rides in the batch right after a0's, not behind all of a's.
    assert batches == [["a0"], ["a1", "b0", "a2"], ["b1", "a3"]]


async def test_a_lone_write_is_not_held_by_the_gather_timer() -> None:
    # One writer at a time (a single client): nothing else is in flight, so each write
    # commits at once instead of waiting max_wait_s for company that cannot come.
    batches: list[list[int]] = []

    async def run(items: list[int]) -> list[object]:
        batches.append(items)
        return list(items)

    committer: GroupCommitter[int] = GroupCommitter(run, max_batch=8, max_wait_s=5.0)
    committer.start()
    loop = asyncio.get_running_loop()
    for i in range(3):
        started = loop.time()
        assert await committer.submit(i) == i
        assert loop.time() - started < 1.0  # the timer (5 s) never ran
    await committer.stop()
    assert batches == [[0], [1], [2]]


async def test_a_batch_gathers_while_other_writes_are_in_flight() -> None:
    # b arrives while a's batch commits (two writers in flight): the next batch waits
    # for company, and c, arriving 20 ms later, joins b's batch instead of its own.
    batches: list[list[str]] = []
    first_commit = asyncio.Event()
    release = asyncio.Event()

    async def run(items: list[str]) -> list[object]:
        batches.append(items)
        if items == ["a"]:
            first_commit.set()
            await release.wait()
        return list(items)

    committer: GroupCommitter[str] = GroupCommitter(run, max_batch=2, max_wait_s=5.0)
    committer.start()
    loop = asyncio.get_running_loop()
    a = asyncio.create_task(committer.submit("a"))
    await first_commit.wait()
    b = asyncio.create_task(committer.submit("b"))
    await asyncio.sleep(0)
    b_at = loop.time()
    release.set()
    assert await a == "a"
    await asyncio.sleep(0.02)
    assert not b.done()  # held for company (max_wait_s), not committed alone
    assert await committer.submit("c") == "c"
    assert await b == "b" and loop.time() - b_at < 1.0  # a full batch ends the wait
    await committer.stop()
    assert batches == [["a"], ["b", "c"]]


async def test_lockstep_writers_stop_waiting_for_company_that_cannot_come() -> None:
    # Three clients in lockstep: each sends its next write when the previous is answered,
    # so every batch already holds every writer in flight. The first batch (several
    # items) waits max_wait_s once and gathers nothing; later batches commit at once.
    # Then a write arriving while a batch commits turns gathering on again.
    batches: list[list[str]] = []
    gate: asyncio.Event | None = None

    async def run(items: list[str]) -> list[object]:
        batches.append(items)
        if gate is not None and items == ["slow"]:
            await gate.wait()
        return list(items)

    wait_s = 0.3
    committer: GroupCommitter[str] = GroupCommitter(run, max_batch=4, max_wait_s=wait_s)
    committer.start()
    loop = asyncio.get_running_loop()
    rounds: list[float] = []

    async def client(name: str) -> None:
        for round_no in range(4):
            started = loop.time()
            assert await committer.submit(f"{name}{round_no}") == f"{name}{round_no}"
            if name == "a":
                rounds.append(loop.time() - started)

    await asyncio.gather(*(client(name) for name in "abc"))
    assert batches == [[f"{n}{r}" for n in "abc"] for r in range(4)]
    assert rounds[0] >= wait_s * 0.9  # the one fruitless wait (timer granularity aside)
    assert all(took < wait_s for took in rounds[1:])  # the timer never ran again

    gate = asyncio.Event()
    slow = asyncio.create_task(committer.submit("slow"))
    while batches[-1] != ["slow"]:
        await asyncio.sleep(0)
    b = asyncio.create_task(committer.submit("b"))
    c = asyncio.create_task(committer.submit("c"))
    await asyncio.sleep(0)
    gate.set()  # b and c arrived while "slow" committed: their batch waits for company
    assert await slow == "slow"
    await asyncio.sleep(0.02)
    assert not b.done() and not c.done()
    assert await committer.submit("d") == "d"
    assert await b == "b" and await c == "c"
    await committer.stop()
    assert batches[-1] == ["b", "c", "d"]


# --- the drain task stopped at any of its await points (loop shutdown, stop racing) ------

async def _gathering(committer: GroupCommitter[int], release: asyncio.Event
                     ) -> tuple[asyncio.Future[object], list[asyncio.Future[object]]]:
    """Drive ``committer`` until its drain task gathers a batch of two items: a first
    write commits (held until ``release``), two more arrive meanwhile (siblings), and
    the next batch, started after ``release``, waits for company (a long ``max_wait_s``)."""
    first = asyncio.ensure_future(committer.submit(1))
    await asyncio.sleep(0.01)  # the first batch is committing, held on ``release``
    later = [asyncio.ensure_future(committer.submit(i)) for i in (2, 3)]
    await asyncio.sleep(0)
    release.set()
    for _ in range(50):
        await asyncio.sleep(0.005)
        if committer._filled is not None:  # noqa: SLF001 - the batch is gathering
            break
    assert committer._filled is not None, "the second batch never gathered"  # noqa: SLF001
    return first, later


async def test_a_drain_task_cancelled_while_gathering_fails_its_batch_closed() -> None:
    """Loop shutdown cancels the drain task at ``await self._gather(...)``: the items
    already taken into the batch are answered 503, never left waiting."""
    release = asyncio.Event()
    batches: list[list[int]] = []

    async def run(items: list[int]) -> list[object]:
        batches.append(items)
        await release.wait()
        return list(items)

    committer: GroupCommitter[int] = GroupCommitter(run, max_batch=8, max_wait_s=30.0)
    committer.start()
    first, later = await _gathering(committer, release)
    assert await first == 1
    assert committer._task is not None  # noqa: SLF001
    committer._task.cancel()  # noqa: SLF001 - what the loop's shutdown does
    outcomes = await asyncio.wait_for(asyncio.gather(*later, return_exceptions=True), 2)
    assert all(isinstance(o, Unavailable) and o.code == "storage_unavailable"
               for o in outcomes), outcomes
    assert batches == [[1]]  # never acknowledged, never run
    with pytest.raises(Unavailable):
        await committer.submit(4)
    await committer.stop()


async def test_a_drain_task_cancelled_while_committing_fails_what_is_still_queued() -> None:
    """Cancelled during a COMMIT: that batch and every item still queued behind it (not
    yet taken into a batch) are answered 503."""
    started = asyncio.Event()

    async def run(items: list[int]) -> list[object]:
        started.set()
        await asyncio.sleep(30)
        return list(items)

    committer: GroupCommitter[int] = GroupCommitter(run, max_batch=2, max_wait_s=0)
    committer.start()
    waiters = [asyncio.ensure_future(committer.submit(i, key=f"t{i}")) for i in range(5)]
    await asyncio.wait_for(started.wait(), 2)
    assert committer.depth == 3
    assert committer._task is not None  # noqa: SLF001
    committer._task.cancel()  # noqa: SLF001
    outcomes = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 2)
    assert all(isinstance(o, Unavailable) for o in outcomes), outcomes
    assert committer.depth == 0
    await committer.stop()


async def test_stop_while_a_batch_gathers_finishes_it_and_what_is_queued() -> None:
    """``stop()`` racing a gathering batch: "finish what is queued, then stop" — the
    gathering batch and the items behind it are committed and acknowledged."""
    release = asyncio.Event()

    async def run(items: list[int]) -> list[object]:
        await release.wait()
        return [i * 10 for i in items]

    committer: GroupCommitter[int] = GroupCommitter(run, max_batch=8, max_wait_s=0.2)
    committer.start()
    first, later = await _gathering(committer, release)
    stopping = asyncio.ensure_future(committer.stop())
    await asyncio.sleep(0)
    with pytest.raises(Unavailable):
        await committer.submit(9)  # refused once stopping
    await asyncio.wait_for(stopping, 5)
    assert await first == 10
    assert [await w for w in later] == [20, 30]


async def test_a_drain_task_that_dies_fails_its_waiters_and_later_submits() -> None:
    """An unexpected fault of the drain loop itself (not of a batch) ends the task: the
    batch and the queue are answered 503, and later submits are refused at once."""
    gate = asyncio.Event()

    async def run(items: list[int]) -> list[object]:
        await gate.wait()
        return list(items)

    committer: GroupCommitter[int] = GroupCommitter(run, max_batch=1, max_wait_s=0)
    committer.start()
    waiters = [asyncio.ensure_future(committer.submit(i, key=f"t{i}")) for i in range(3)]
    await asyncio.sleep(0.01)

    def broken(batch: list[object]) -> None:
        raise RuntimeError("bookkeeping bug")

    committer._take = broken  # type: ignore[method-assign,assignment]  # noqa: SLF001
    gate.set()
    outcomes = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 2)
    assert outcomes[0] == 0
    assert all(isinstance(o, Unavailable) for o in outcomes[1:]), outcomes
    with pytest.raises(Unavailable):
        await committer.submit(5)
    await committer.stop()
