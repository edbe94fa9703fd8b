"""A circuit breaker: stop asking a server that keeps failing, probe it again later.

``closed`` → (``threshold`` consecutive failed attempts) → ``open``: every request fails
at once with ``breaker_open`` → (``cooldown`` seconds) → ``half_open``: one probe request
is let through; its success closes the breaker, its failure opens it again. A failure is
a transport error, a timeout or a 5xx; any other answer (even a 4xx) proves the server
is up. Thread-safe; one breaker per gate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

State = Literal["closed", "open", "half_open"]


class Breaker:
    def __init__(self, *, threshold: int, cooldown: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if threshold < 1 or cooldown <= 0:
            raise ValueError("breaker threshold must be >= 1 and cooldown > 0")
        self.threshold, self.cooldown, self._clock = threshold, cooldown, clock
        self._lock = threading.Lock()
        self._state: State = "closed"
        self._failures = 0
        self._since = 0.0  # when it opened, or when the current probe started

    @property
    def state(self) -> State:
        with self._lock:
            if self._state == "open" and self._clock() - self._since >= self.cooldown:
                return "half_open"
            return self._state

    def allow(self) -> bool:
        """May a request be sent now? (In ``half_open``, only one probe at a time.)"""
        with self._lock:
            if self._state == "closed":
                return True
            now = self._clock()
            if now - self._since < self.cooldown:
                return False
            # Cooldown over (or a probe that never reported back went stale): probe once.
            self._state, self._since = "half_open", now
            return True

    def record(self, *, ok: bool) -> None:
        """Report the result of an allowed request."""
        with self._lock:
            if ok:
                self._state, self._failures = "closed", 0
                return
            self._failures += 1
            if self._state == "half_open" or self._failures >= self.threshold:
                self._state, self._since = "open", self._clock()
