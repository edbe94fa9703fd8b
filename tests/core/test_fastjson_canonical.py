"""The orjson proof of RFC 8785 bytes (``cosigner.core.fastjson.canonical``, issue 20)
against its references: whenever it answers, the bytes are the ``rfc8785`` package's and
``canonical._check`` (the reference walk) finds the value valid and simple; for anything
the reference refuses or prints otherwise it does not answer, so ``canonicalize`` keeps
the reference's bytes and errors."""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
import rfc8785
from hypothesis import example, given
from hypothesis import strategies as st

from cosigner.core import fastjson
from cosigner.core.canonical import _check, canonicalize, canonicalize_member
from cosigner.core.errors import InvalidJSON
from tests.core.test_fastjson import KEYS, MANY, SIMPLE, VALUES


class Colour(enum.Enum):
    RED = 1


class Size(enum.IntEnum):
    BIG = 2


class Mood(enum.StrEnum):
    CALM = "calm"


class Text(str):
    pass


class Number(int):
    pass


class Ratio(float):
    pass


@dataclasses.dataclass
class Point:
    x: int


#: Values orjson can print (natively or as a subclass) that the reference refuses or
#: prints otherwise, and some it refuses itself.
ODD = st.sampled_from([
    (1, 2), (), 1.5, 0.0, -0.0, 1e21, float("nan"), Colour.RED, Size.BIG, Mood.CALM,
    uuid.UUID(int=7), orjson.Fragment(b"1"), Text("a"), Number(3), Ratio(2.0), Point(1),
    datetime(2026, 1, 1, tzinfo=UTC), b"x", {1, 2}, OrderedDict(a=1), 2**53, -(2**53),
    2**64, "\ud800", "a\udfffb", object(),
])
ODD_KEYS = st.sampled_from([1, Text("k"), "\ud800", "\U0001f600", "\U00010000", (1,), None,
                            True, Mood.CALM])
WITH_ODD = st.recursive(
    st.one_of(VALUES, ODD),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.tuples(inner),
        st.dictionaries(st.one_of(KEYS, ODD_KEYS), inner, max_size=4)),
    max_leaves=12)


def reference(value: Any) -> tuple[str, Any]:
    """What the reference walk says (simple or not), or its error code."""
    try:
        return "ok", _check(value)
    except Exception as exc:  # noqa: BLE001 - _Reject or RecursionError: any refusal
        return "refused", type(exc).__name__


@MANY
@given(value=WITH_ODD)
@example(value={"a": (1,)})
@example(value={"a": [Colour.RED]})
@example(value={"a": uuid.UUID(int=1)})
@example(value={"a": orjson.Fragment(b"{}")})
@example(value={Text("a"): 1})
@example(value={"\U0001f600": 1, "\ue000": 2})
@example(value={"a": 2**53 - 1, "b": -(2**53 - 1)})
@example(value={"a": 2**53})
def test_the_proof_answers_only_with_the_reference_bytes(value: Any) -> None:
    fast = fastjson.canonical(value)
    if fast is not None:
        assert reference(value) == ("ok", True), value
        assert fast == rfc8785.dumps(value)
        assert fast == canonicalize(value)


@MANY
@given(value=SIMPLE)
@example(value={"k": "\U0001f600"})
@example(value={"\uffff": [1, "\x00\x1f\u2028\"\\/"], "": None, "é": True})
def test_the_proof_holds_for_plain_objects_and_arrays(value: Any) -> None:
    if not isinstance(value, dict | list):
        assert fastjson.canonical(value) is None  # scalars: the reference path
        return
    fast = fastjson.canonical(value)
    beyond_bmp = any(ord(c) > 0xFFFF for c in orjson.dumps(value).decode())
    assert (fast is None) == beyond_bmp  # non-BMP characters anywhere: the reference path
    assert canonicalize(value) == rfc8785.dumps(value)


@pytest.mark.parametrize("value", [
    {"a": (1, 2)}, [Colour.RED], {"a": Size.BIG}, {"a": Mood.CALM}, [uuid.UUID(int=3)],
    [orjson.Fragment(b"1")], {"a": Text("x")}, {Text("a"): 1}, {1: "a"}, [Number(1)],
    [Ratio(1.0)], [Point(1)], [datetime(2026, 1, 1, tzinfo=UTC)], {"a": b"x"},
    {"a": {1}}, OrderedDict(a=1), [OrderedDict(a=1)], {"a": 1.0}, [2**53], [-(2**53)],
    ["\ud800"], {"\udc00": 1}, {"\U0001f600": 1}, [object()],
])
def test_the_proof_does_not_answer_for_what_the_reference_decides(value: Any) -> None:
    assert fastjson.canonical(value) is None
    assert fastjson.canonical_member({"args": value}, "args") is None


def test_deep_nesting_falls_back() -> None:
    value: Any = 1
    for _ in range(300):
        value = [value]
    assert fastjson.canonical(value) is None
    assert canonicalize(value) == rfc8785.dumps(value)


@MANY
@given(args=WITH_ODD, rest=SIMPLE)
def test_canonicalize_member_is_both_canonical_forms(args: Any, rest: Any) -> None:
    whole = {"args": args, "rest": rest}
    both = canonicalize_member(whole, "args")
    if both is not None:
        assert both == (canonicalize(args), canonicalize(whole))
        assert both == (rfc8785.dumps(args), rfc8785.dumps(whole))


def test_canonicalize_member_needs_an_object_holding_the_key() -> None:
    assert canonicalize_member({"args": {"a": 1}}, "args") == (b'{"a":1}', b'{"args":{"a":1}}')
    assert canonicalize_member({"other": 1}, "args") is None
    assert canonicalize_member([{"args": 1}], "args") is None
    assert canonicalize_member({"args": 1.5}, "args") is None


def test_errors_stay_the_reference_ones() -> None:
    with pytest.raises(InvalidJSON) as info:
        canonicalize({"a": [1, {"b": 2**53}]})
    assert (info.value.code, info.value.extra["pointer"]) == ("unsafe_integer", "/a/1/b")
    with pytest.raises(InvalidJSON) as info:
        canonicalize({"a": (1,)})
    assert (info.value.code, info.value.extra["pointer"]) == ("invalid_json", "/a")
