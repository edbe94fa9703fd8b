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


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)
#: The last UTC second formatted: ((year, month, day, hour, minute, second), its
#: ``YYYY-MM-DDTHH:MM:SS`` text, its NumericDate). Requests within one second share it.
_last_second: tuple[tuple[int, ...], str, int] = ((), "", 0)


def _second_of(utc: datetime) -> tuple[str, int]:
    """``(YYYY-MM-DDTHH:MM:SS, NumericDate)`` of an aware UTC datetime, cached per second."""
    global _last_second
    key = (utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second)
    cached = _last_second
    if cached[0] != key:
        whole = utc.replace(microsecond=0)
        cached = _last_second = (key, whole.replace(tzinfo=None).isoformat(),
                                 (whole - _EPOCH) // _SECOND)
    return cached[1], cached[2]


def isoformat(at: datetime) -> str:
    """RFC 3339 UTC with microseconds and a ``Z`` suffix (``strftime("%Y-%m-%dT%H:%M:%S.%fZ")``,
    years 1000-9999); the text up to the second is formatted once per second."""
    utc = at if at.tzinfo is UTC else at.astimezone(UTC)
    return f"{_second_of(utc)[0]}.{utc.microsecond:06d}Z"


def numeric_date(moment: datetime) -> int:
    """Whole seconds since the epoch, floored (RFC 7519 NumericDate). ``moment`` must be aware."""
    if moment.tzinfo is UTC:
        return _second_of(moment)[1]
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("datetime must be timezone-aware")
    return (moment - _EPOCH) // _SECOND


#: The last expiry seen: ``(exp, its UTC datetime, its text)``. Permits minted in the same
#: second with the same lifetime share it (``strftime`` is the costliest part of preparing
#: a permit's row after the signature).
_last_expiry: tuple[int, datetime, str] = (-1, datetime.min, "")


def expiry_of(exp: int) -> tuple[datetime, str]:
    """``exp`` (RFC 7519 NumericDate, s) as an aware UTC datetime and its RFC 3339 text to
    the second, ``YYYY-MM-DDTHH:MM:SSZ`` (a permit's ``expires_at``); the last one is
    remembered.

    Raises:
        OverflowError, OSError, ValueError: ``exp`` is not a representable date.
    """
    global _last_expiry  # noqa: PLW0603 - a one-entry memo
    last = _last_expiry
    if last[0] != exp:
        at = datetime.fromtimestamp(exp, UTC)
        last = _last_expiry = (exp, at, at.strftime("%Y-%m-%dT%H:%M:%SZ"))
    return last[1], last[2]
