"""cosigner.core.clock.isoformat: RFC 3339 UTC text, the same as the strftime form it replaced."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from cosigner.core.clock import isoformat

_offsets = st.integers(min_value=-14 * 60, max_value=14 * 60).map(
    lambda minutes: timezone(timedelta(minutes=minutes)))


@given(st.datetimes(min_value=datetime(1001, 1, 1), max_value=datetime(9998, 12, 31),
                    timezones=st.just(UTC) | _offsets))
def test_isoformat_is_utc_with_microseconds_and_z(moment: datetime) -> None:
    text = isoformat(moment)
    assert text == moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert datetime.fromisoformat(text) == moment
