"""Sliding-window counters in process memory: the ``limits`` package's sliding window
counter (``SlidingWindowCounterRateLimiter`` over ``MemoryStorage``), computed the same
way without its asyncio storage layer (issue 20: five counters per decision cost
~40–60 µs through ``limits.aio``, ~2 µs here).

A counter of ``limit`` hits per ``expiry`` seconds for a key keeps the counts of the
current fixed window (``int(now / expiry)``) and of the one before it; a hit is admitted
when ``floor(previous * previous_ttl / expiry + current) + 1 <= limit``, with
``previous_ttl = (1 - ((now - expiry) / expiry) % 1) * expiry`` (0 without previous hits):
exactly ``limits``' ``acquire_sliding_window_entry``. :meth:`Windows.reset_in` is its
``get_window_stats`` reset time. tests/identity/test_windows.py replays random hit
sequences through both and compares every answer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class Windows:
    """Counters by ``(key, limit, expiry)``; single-threaded (one event loop)."""

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now
        # (key, limit, expiry) → [window index, count in it, count in the window before]
        self._counts: dict[tuple[str, int, int], list[int]] = {}

    def _state(self, name: tuple[str, int, int], expiry: int, now: float) -> list[int]:
        window = int(now / expiry)
        state = self._counts.get(name)
        if state is None:
            if len(self._counts) >= 100_000:
                self._prune(now)
            state = self._counts[name] = [window, 0, 0]
        elif state[0] != window:
            state[2] = state[1] if state[0] == window - 1 else 0
            state[0], state[1] = window, 0
        return state

    def hit(self, key: str, limit: int, expiry: int) -> bool:
        """Count one hit of ``key`` against ``limit`` per ``expiry`` s; False (and not
        counted) when that would exceed the limit."""
        return self.hit_all(((key, limit, expiry),)) < 0

    def hit_all(self, counters: tuple[tuple[str, int, int], ...]) -> int:
        """Count one hit on each ``(key, limit, expiry)`` of ``counters`` in order, at one
        instant, as :meth:`hit` would; stop at the first that refuses. Returns its index
        (that counter not counted, the ones before it counted), or -1 when all admitted."""
        now = self._now()
        counts = self._counts
        index = 0
        for name in counters:
            _, limit, expiry = name
            if limit < 1:
                return index
            window = int(now / expiry)
            state = counts.get(name)
            if state is None or state[0] != window:
                state = self._state(name, expiry, now)
            count, previous = state[1], state[2]
            # Far from the limit the weighted sum need not be computed: previous * ttl /
            # expiry is at most previous (ttl <= expiry), so count + previous < limit
            # admits (tests/identity/test_windows.py holds it to the full test).
            if count + previous >= limit:
                if not previous:  # the full test without a previous window
                    return index
                ttl = (1 - (((now - expiry) / expiry) % 1)) * expiry
                if math.floor(previous * ttl / expiry + count) + 1 > limit:
                    return index
            state[1] = count + 1
            index += 1
        return -1

    def reset_in(self, key: str, limit: int, expiry: int) -> float:
        """Seconds until the counter has room again (``limits``' window-stats reset time
        minus now; 0 when nothing was counted)."""
        now = self._now()
        state = self._state((key, limit, expiry), expiry, now)
        current, previous = state[1], state[2]
        if not (previous or current):
            return 0.0
        previous_in = current_in = math.inf
        if previous:
            ttl = (1 - (((now - expiry) / expiry) % 1)) * expiry
            previous_in = ttl % (expiry / previous)
        if current:
            current_in = ((1 - ((now / expiry) % 1)) * expiry + expiry) % expiry
        return min(previous_in, current_in)

    def _prune(self, now: float) -> None:
        """Drop counters whose windows are over (they would read as zero)."""
        self._counts = {name: state for name, state in self._counts.items()
                        if state[0] >= int(now / name[2]) - 1}
