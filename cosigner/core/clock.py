"""Injectable UTC clock so tests can pin exact boundaries (expiry, nbf)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    """Now, timezone-aware UTC."""
    return datetime.now(UTC)


class FrozenClock:
    """A clock that only moves when told (tests)."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at

    def advance(self, **delta: float) -> None:
        self.at = self.at + timedelta(**delta)


def isoformat(at: datetime) -> str:
    """RFC 3339 UTC with microseconds and a ``Z`` suffix."""
    utc = at if at.tzinfo is UTC else at.astimezone(UTC)
    # Same text as strftime("%Y-%m-%dT%H:%M:%S.%fZ") (years 1000-9999), at a third of the cost.
    return utc.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def numeric_date(moment: datetime) -> int:
    """Whole seconds since the epoch, floored (RFC 7519 NumericDate). ``moment`` must be aware."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("datetime must be timezone-aware")
    return (moment - _EPOCH) // timedelta(seconds=1)
