"""The per-second cache of isoformat/numeric_date (issue 20) gives exactly the uncached
text and number, for any aware datetime, in any order of calls."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from cosigner.core.clock import isoformat, numeric_date

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ZONES = st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)),
                         timezone(timedelta(hours=-8)), timezone(timedelta(0))])
MOMENTS = st.datetimes(min_value=datetime(1000, 1, 2), max_value=datetime(9999, 12, 30),
                       timezones=ZONES)


def reference_iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def reference_numeric(at: datetime) -> int:
    return (at - EPOCH) // timedelta(seconds=1)


@settings(max_examples=500, deadline=None)
@given(moments=st.lists(MOMENTS, min_size=1, max_size=6), micro=st.integers(0, 999_999))
def test_cached_seconds_match_the_uncached_forms(moments: list[datetime], micro: int) -> None:
    for at in moments + [m.replace(microsecond=micro) for m in moments]:
        assert isoformat(at) == reference_iso(at)
        assert numeric_date(at) == reference_numeric(at)


def test_negative_and_boundary_seconds() -> None:
    for at in (datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
               datetime(1970, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
               datetime(2029, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)):
        assert isoformat(at) == reference_iso(at)
        assert numeric_date(at) == reference_numeric(at)
