"""cosigner.identity.windows computes the ``limits`` package's sliding window counter
exactly: random hit sequences on a shared fake clock get the same admit/refuse answers
and reset times from both (issue 20)."""

from __future__ import annotations

import asyncio
import math
import time

from hypothesis import example, given, settings
from hypothesis import strategies as st
from limits import RateLimitItemPerSecond
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import SlidingWindowCounterRateLimiter

from cosigner.identity.windows import Windows

STEPS = st.lists(st.tuples(st.one_of(st.floats(0, 2.5), st.floats(0, 10)),
                           st.sampled_from(["a", "b"])), min_size=1, max_size=120)


@settings(max_examples=300, deadline=None)
@example(limit=2, expiry=1, start=1_700_000_000.0,  # a gap of two windows forgets all
         steps=[(0.4, "a"), (0.4, "a"), (8.2, "a"), (0.04, "a"), (0.04, "a")])
@example(limit=3, expiry=10, start=1_700_000_000.0,  # the previous window's weight
         steps=[(3.0, "a"), (0.1, "a"), (0.1, "a"), (1.0, "a"), (0.1, "a"), (0.1, "a")])
@given(limit=st.integers(1, 12), expiry=st.sampled_from([1, 2, 10, 60]), steps=STEPS,
       start=st.floats(1_700_000_000, 1_800_000_000))
def test_same_answers_as_limits(limit: int, expiry: int, steps: list[tuple[float, str]],
                                start: float) -> None:
    clock = [start]
    ours = Windows(now=lambda: clock[0])
    import limits.aio.storage.memory as memory
    import limits.aio.strategies as strategies

    # Both modules' ``time`` is the one ``time`` module: save its function once, restore it
    # once (saving it again after the first patch would leak the fake clock to later tests).
    real_time = time.time
    memory.time.time = strategies.time.time = lambda: clock[0]  # type: ignore[assignment]
    try:
        theirs = SlidingWindowCounterRateLimiter(MemoryStorage())
        item = RateLimitItemPerSecond(limit, expiry)

        async def run() -> None:
            for delta, key in steps:
                clock[0] += delta * expiry / 4
                expected = await theirs.hit(item, key)
                assert ours.hit(key, limit, expiry) == expected, (clock[0], key)
                if not expected:
                    stats = await theirs.get_window_stats(item, key)
                    assert math.isclose(ours.reset_in(key, limit, expiry),
                                        stats.reset_time - clock[0], abs_tol=1e-6)

        asyncio.run(run())
    finally:
        time.time = real_time  # type: ignore[assignment]
    assert time.time is real_time


COUNTERS = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 4),
                              st.sampled_from([1, 10, 60])), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(rounds=st.lists(st.tuples(st.floats(0, 15), COUNTERS), min_size=1, max_size=30),
       start=st.floats(1_700_000_000, 1_800_000_000))
def test_hit_all_is_hit_in_order_until_a_refusal(
        rounds: list[tuple[float, list[tuple[str, int, int]]]], start: float) -> None:
    """``hit_all`` answers and counts as ``hit`` on each counter in turn, stopping at the
    first refusal (the quotas' order: credential, tenant, then the decision quota)."""
    clock = [start]
    together, one_by_one = Windows(now=lambda: clock[0]), Windows(now=lambda: clock[0])
    for delta, counters in rounds:
        clock[0] += delta
        expected = next((i for i, c in enumerate(counters) if not one_by_one.hit(*c)), -1)
        assert together.hit_all(tuple(counters)) == expected
    assert together._counts == one_by_one._counts
