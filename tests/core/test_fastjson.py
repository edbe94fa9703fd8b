"""The orjson fast paths (cosigner.core.fastjson, issue 20) against their references:
``parse_json`` against the stdlib strict parser (``_parse_stdlib``: same value with the
same types, or the same error code and detail), and ``canonicalize`` byte for byte
against the ``rfc8785`` package (floats, exponents, non-BMP keys, escapes, key order by
UTF-16 code units)."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import orjson
import pytest
import rfc8785
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cosigner.core import fastjson
from cosigner.core.canonical import _check, _parse_stdlib, canonicalize, parse_json
from cosigner.core.errors import InvalidJSON

MANY = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))

KEYS = st.one_of(
    st.text(max_size=4),
    st.sampled_from(["a", "b", "a:b", ":", "\ue000", "\uffff", "\U0001f600", "\U00010000",
                     "é", "", "\x00", "\x1f", "\x7f", '"', "\\", "\u2028", "a\u005fb",
                     "a_b"]),
)
SAFE_INT = st.integers(-(2**53) + 1, 2**53 - 1)
FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1e21, 1e-7, 1e20, 5e-324, 1.7976931348623157e308,
                     100000.0, 0.1, 2.0**53, 9007199254740993.0, 1e23, 123456789.125]),
)
TEXT = st.one_of(st.text(max_size=8),
                 st.sampled_from(["12:30:00", "http://x", "\u2028", "\x00\x08\x0c\x1b",
                                  '"\\/', "\U0001f600", "\ud7ff\ue000"]))
SCALARS = st.one_of(st.none(), st.booleans(), SAFE_INT, FLOATS, TEXT)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)), max_leaves=16)
SIMPLE = st.recursive(
    st.one_of(st.none(), st.booleans(), SAFE_INT, TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(KEYS, inner, max_size=4)), max_leaves=16)


def same(a: Any, b: Any) -> bool:
    """Equal with the same types throughout (floats bit for bit, bool is not int)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return struct.pack("<d", a) == struct.pack("<d", b)
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def outcome(parse: Any, body: bytes) -> tuple[str, Any]:
    try:
        return "ok", parse(body)
    except InvalidJSON as exc:
        return "error", (exc.code, exc.detail, exc.extra)


def assert_parsers_agree(body: bytes) -> None:
    fast, slow = outcome(parse_json, body), outcome(_parse_stdlib, body)
    assert fast[0] == slow[0], (body, fast, slow)
    if fast[0] == "ok":
        assert same(fast[1], slow[1]), (body, fast, slow)
    else:
        assert fast[1] == slow[1], (body, fast, slow)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """JSON texts as clients write them, then often damaged in a way the strict parser
    must notice: a duplicated key, an unsafe or huge integer, NaN, an escape, a cut."""
    value = draw(VALUES)
    text = json.dumps(value, ensure_ascii=draw(st.booleans()),
                      separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    fault = draw(st.integers(0, 9))
    if fault == 0 and "{" in text:
        at = text.index("{") + 1
        key = json.dumps(draw(KEYS))
        item = draw(st.sampled_from(["1", '"x:y"', "[]", "{}"]))
        dup = f"{key}: {item}"
        text = text[:at] + f"{dup}, {dup}" + ("," if text[at] != "}" else "") + text[at:]
    elif fault == 1:
        big = draw(st.sampled_from(["9007199254740992", "-9007199254740992",
                                    "18446744073709551616", "1" * 40, "-0", "1e400",
                                    "-1e400", "NaN", "Infinity", "-Infinity", "1E2",
                                    "9007199254740991", "1.0e5", "0.1e-400", "01"]))
        text = f"[{text}, {big}]"
    elif fault == 2:
        text = text.replace(draw(st.sampled_from(["a", ":", "1", '"'])),
                            draw(st.sampled_from(["\\u0061", "\\u003a", "\\ud800", "\\\\u",
                                                  ":", "\\u005f"])), 1)
    elif fault == 3 and text:
        text = text[: draw(st.integers(0, len(text)))]
    elif fault == 4:
        text = draw(st.sampled_from(["\ufeff", " ", "\t", "\n", ""])) + text
    raw = text.encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 15)) == 0:
        raw += draw(st.sampled_from([b"\xff", b"\xed\xa0\x80", b" ", b"\x00", b"]"]))
    return raw


@MANY
@given(body=bodies())
@example(body=b'{"a": 1, "a": 2}')
@example(body=b'{"a": "x:y", "a": "z"}')
@example(body=b'{"a:b": 1, "a": {"c": 1, "c": 2}}')
@example(body=b'{"a\\u005fb": 1, "a_b": 2}')
@example(body=b'{"a": 1, "a": "\\u003a"}')
@example(body=b"[18446744073709551616]")
@example(body=b"[9007199254740993]")
@example(body=b"1e20")
@example(body=b"[1e400]")
@example(body=b'"\\ud800"')
@example(body=b"\xef\xbb\xbf{}")
@example(body=b"[" * 300 + b"]" * 300)
@example(body=b"[" * 199 + b"]" * 199)
def test_parse_json_agrees_with_the_stdlib_parser(body: bytes) -> None:
    assert_parsers_agree(body)


@MANY
@given(raw=st.binary(max_size=40))
def test_parse_json_agrees_on_arbitrary_bytes(raw: bytes) -> None:
    assert_parsers_agree(raw)


def test_fast_path_is_taken_for_plain_bodies() -> None:
    body = b'{"request_id": "r-1", "run": {"id": "run-1", "at": "12:00"}, "n": [1, 2.5]}'
    assert fastjson.loads(body)[0]
    assert not fastjson.loads(b'{"a": 1, "a": 2}')[0]
    assert not fastjson.loads(b'{"a": "x:y", "a": "z:w"}')[0]


@MANY
@given(value=VALUES)
@example(value={"\ue000": 1, "\U0001f600": 2})
@example(value={"a": [1e21, 1e-7, -0.0, 100000.0, 5e-324]})
@example(value=["\x00\x1f\x7f\u2028\"\\/"])
def test_canonicalize_is_rfc8785_byte_for_byte(value: Any) -> None:
    assert canonicalize(value) == rfc8785.dumps(value)


@MANY
@given(value=SIMPLE)
@example(value={"\uffff": 1, "\ue000": 2, "z": 3, "": 4, "é": 5})
def test_orjson_sorted_output_is_rfc8785_where_check_says_simple(value: Any) -> None:
    if _check(value):
        assert fastjson.dumps_sorted(value) == rfc8785.dumps(value)


def test_non_bmp_keys_are_not_simple() -> None:
    value = {"\ue000": 1, "\U0001f600": 2}
    assert not _check(value)
    # orjson sorts by code point; RFC 8785 by UTF-16 code units: they differ here.
    assert fastjson.dumps_sorted(value) != rfc8785.dumps(value)
    assert canonicalize(value) == rfc8785.dumps(value)


def test_deep_values_fall_back_to_the_stdlib_encoder() -> None:
    value: Any = 1
    for _ in range(300):
        value = [value]
    assert fastjson.dumps_sorted(value) is None
    assert canonicalize(value) == rfc8785.dumps(value)


@pytest.mark.parametrize("literal", ["1e400", "NaN", "-Infinity"])
def test_non_finite_literals_keep_their_code(literal: str) -> None:
    with pytest.raises(InvalidJSON) as info:
        parse_json(f"[{literal}]".encode())
    assert info.value.code == "non_finite_number"
    assert not math.isfinite(float(literal.replace("1e400", "inf")))


@MANY
@given(value=VALUES, extra=st.sampled_from([
    None, "9007199254740991", "9007199254740992", "-9007199254740992", "18446744073709551616",
    "-9223372036854775809", "100000000000000000000", "1e20", "1E2", "1e400", "-0", "0.0",
    "-0.0", "5e-324", "1e-400"]))
def test_compact_bodies_as_orjson_writes_them_agree(value: Any, extra: str | None) -> None:
    # orjson's own compact text is the one the fast path proves without walking the values
    body = orjson.dumps(value)
    if extra is not None:
        body = b"[" + body + b"," + extra.encode() + b"]"
    assert_parsers_agree(body)


def has_float(value: Any) -> bool:
    if type(value) is dict:
        return any(map(has_float, value.values()))
    if type(value) is list:
        return any(map(has_float, value))
    return type(value) is float


@MANY
@given(a=VALUES, b=VALUES)
def test_exact_key_names_a_value_with_its_types_and_key_order(a: Any, b: Any) -> None:
    """Equal keys ⇔ the same value, types and key order included; no key with a float."""
    if type(a) not in (dict, list):
        a = [a]
    key_a, key_b = fastjson.exact_key(a), fastjson.exact_key(b)
    assert (key_a is None) == has_float(a)  # VALUES: safe integers, no lone surrogate
    if key_a is not None:
        assert orjson.loads(key_a) == a and same(orjson.loads(key_a), a)
        assert key_a == json.dumps(a, ensure_ascii=False, separators=(",", ":")).encode()
    if key_a is not None and key_b is not None:
        assert (key_a == key_b) == same(a, b)


def test_exact_key_refuses_what_it_cannot_name() -> None:
    class Text(str):
        pass

    assert fastjson.exact_key({"a": 1.0}) is None
    assert fastjson.exact_key({"a": Text("x")}) is None
    assert fastjson.exact_key({"a": (1,)}) is None
    assert fastjson.exact_key({"a": 2**53}) is None
    assert fastjson.exact_key({"a": "\ud800"}) is None
    assert fastjson.exact_key("a") is None
    assert fastjson.exact_key({"a": True}) != fastjson.exact_key({"a": 1})
    assert fastjson.exact_key({"a": 1, "b": 2}) != fastjson.exact_key({"b": 2, "a": 1})
