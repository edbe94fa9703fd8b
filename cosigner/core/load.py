"""Load shedding state of one process: which bounded queue refused work, and when.

Every bound (the group-commit queues, long-polls per credential, the webhook backlog)
raises :class:`cosigner.core.errors.Overloaded` past its limit and reports it here with
:meth:`Shedding.shed`; ``/readyz`` answers 503 while any shed happened within
``hold_s`` seconds, so a load balancer steers new traffic to another replica. Counts are
kept per source for operators (never reset).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from cosigner.core.errors import Overloaded


@dataclass
class Shedding:
    """Recent sheds per source (``log_writer``, ``refusals``, ``long_poll``, ``webhooks``)."""

    hold_s: float = 2.0
    retry_after_s: int = 1
    counts: dict[str, int] = field(default_factory=dict)
    _last: dict[str, float] = field(default_factory=dict)

    def shed(self, source: str, detail: str) -> Overloaded:
        """Count one refusal by ``source`` and return the error to raise (503 ``overloaded``
        with ``retry_after``)."""
        self.counts[source] = self.counts.get(source, 0) + 1
        self._last[source] = time.monotonic()
        return Overloaded(detail, retry_after=max(1, math.ceil(self.retry_after_s)),
                          source=source)

    def overloaded(self) -> list[str]:
        """Sources that shed within the last ``hold_s`` seconds (empty: not overloaded)."""
        now = time.monotonic()
        return sorted(s for s, at in self._last.items() if now - at < self.hold_s)
