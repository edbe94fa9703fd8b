"""A stored JSON value reads back as written, integers beyond 64 bits included (found in
review, session 5: orjson read them as floats instead of refusing them, so the stdlib
fallback never ran; requests with integers outside ±(2**53 − 1) are refused with 422
before anything is stored, so no answer was affected)."""

from __future__ import annotations

import pytest

from cosigner.db import compressed


@pytest.mark.parametrize("n", [2**70, -(2**70), 2**64, 2**63 - 1, -(2**63), 10**19, 1.5e300])
def test_an_integer_beyond_64_bits_reads_back_as_written(n: int | float) -> None:
    kind = compressed.ResponseJSON()
    value = {"n": n, "permit": None}
    stored = kind.process_bind_param(value, None)  # type: ignore[arg-type]
    assert kind.process_result_value(stored, None) == value  # type: ignore[arg-type]
    assert type(kind.process_result_value(stored, None)["n"]) is type(n)  # type: ignore[arg-type]
