"""Tests for cosigner.core.canonical: RFC 8785 bytes, strict parsing, args hashing (invariant 3)."""

from __future__ import annotations

import hashlib
import json
import math
import random
import struct
from collections import OrderedDict
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from cosigner.core import canonical
from cosigner.core.canonical import (
    MAX_SAFE_INTEGER,
    args_hash,
    canonicalize,
    check_hashable,
    hash_bytes,
    parse_json,
)
from cosigner.core.errors import InvalidJSON


def _code(exc: pytest.ExceptionInfo[InvalidJSON]) -> str:
    return exc.value.code


# ------------------------------------------------------------------ K19: canonical JSON bytes


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"a":0.000001}', b'{"a":0.000001}'),
        ('{"a":1e-7}', b'{"a":1e-7}'),
        ('{"a":1e20}', b'{"a":100000000000000000000}'),
        ('{"a":1e21}', b'{"a":1e+21}'),
        ('{"a":-0.0}', b'{"a":0}'),
        ('{"a":-0}', b'{"a":0}'),
        ('{"k":"é"}', '{"k":"é"}'.encode()),
        ('{"k":"\\u00e9"}', '{"k":"é"}'.encode()),
        ('{"a":100000.0}', b'{"a":100000}'),
        ('{"a":4.50}', b'{"a":4.5}'),
        ('{ "b" : 2 , "a" : [ 1 , true , null ] }', b'{"a":[1,true,null],"b":2}'),
    ],
)
def test_k19_canonical_bytes(body: str, expected: bytes) -> None:
    assert canonicalize(parse_json(body)) == expected
    assert canonicalize(parse_json(body.encode())) == expected


def test_k19_raw_utf8_not_escaped() -> None:
    assert canonicalize({"k": "é"}) == b'{"k":"\xc3\xa9"}'
    assert canonicalize("😀") == '"😀"'.encode()


def test_k19_keys_sorted_by_utf16_code_units() -> None:
    # U+1F600 is the surrogate pair D83D DE00, which sorts before E000 in UTF-16
    # (code-point order would put it last).
    value = parse_json('{"\\ue000": 1, "😀": 2}')
    assert canonicalize(value) == '{"😀":2,"\ue000":1}'.encode()


def test_k19_rfc8785_sorting_example() -> None:
    # RFC 8785 §3.2.3.
    body = (
        '{"\\u20ac":"Euro Sign","\\r":"Carriage Return","\\ufb33":"Hebrew Letter Dalet With'
        ' Dagesh","1":"One","\\ud83d\\ude00":"Emoji: Grinning Face","\\u0080":"Control",'
        '"\\u00f6":"Latin Small Letter O With Diaeresis"}'
    )
    keys = list(json.loads(canonicalize(parse_json(body))))
    assert keys == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


def test_k19_rfc8785_section_3_2_2_example() -> None:
    body = (
        '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
        ' "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
        ' "literals": [null, true, false]}'
    )
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    ).encode()
    assert canonicalize(parse_json(body)) == expected


# RFC 8785 Appendix B: IEEE 754 bit patterns and their canonical form.
APPENDIX_B = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


def _from_hex(bits: str) -> float:
    value: float = struct.unpack(">d", bytes.fromhex(bits))[0]
    return value


@pytest.mark.parametrize(("bits", "expected"), APPENDIX_B)
def test_k19_rfc8785_appendix_b_numbers(bits: str, expected: str) -> None:
    assert canonicalize(_from_hex(bits)) == expected.encode()


@pytest.mark.parametrize("bits", ["7fffffffffffffff", "7ff0000000000000", "fff0000000000000"])
def test_k19_rfc8785_appendix_b_errors(bits: str) -> None:
    with pytest.raises(InvalidJSON) as exc:
        canonicalize(_from_hex(bits))
    assert _code(exc) == "non_finite_number"


def test_k19_key_order_and_number_form_do_not_change_hash() -> None:
    assert args_hash(parse_json('{"b":2,"a":1}')) == args_hash(parse_json('{"a":1,"b":2}'))
    assert args_hash({"amount_minor": 100000}) == args_hash({"amount_minor": 100000.0})
    assert args_hash(parse_json('{"x":100000}')) == args_hash(parse_json('{"x":1.0e5}'))
    assert args_hash({"a": 1}) != args_hash({"a": 2})


def test_hash_format() -> None:
    assert hash_bytes(b"") == "sha256:" + hashlib.sha256(b"").hexdigest()
    digest = args_hash({"a": 1})
    assert digest == "sha256:" + hashlib.sha256(b'{"a":1}').hexdigest()
    assert len(digest) == len("sha256:") + 64


# --------------------------------------------------------------- K20: unrepresentable numbers


@pytest.mark.parametrize(
    "body",
    [
        '{"account_id": 9007199254740993}',
        '{"account_id": 9007199254740992}',
        '{"account_id": -9007199254740992}',
        '{"a": [1, {"b": 123456789012345678901234567890}]}',
        "1" * 5000,  # longer than int_max_str_digits: must not leak a ValueError
    ],
)
def test_k20_unsafe_integer_literals_rejected(body: str) -> None:
    with pytest.raises(InvalidJSON) as exc:
        parse_json(body)
    assert _code(exc) == "unsafe_integer"
    assert "9007199254740993" not in exc.value.detail


def test_k20_safe_integer_bounds_accepted() -> None:
    body = f"[{MAX_SAFE_INTEGER}, -{MAX_SAFE_INTEGER}]"
    assert parse_json(body) == [MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER]
    assert canonicalize(parse_json(body)) == body.replace(" ", "").encode()


@pytest.mark.parametrize(
    "body",
    ["NaN", '{"a": NaN}', '{"a": Infinity}', '{"a": [-Infinity]}', '{"a": 1e400}', "-1e400"],
)
def test_k20_non_finite_numbers_rejected(body: str) -> None:
    with pytest.raises(InvalidJSON) as exc:
        parse_json(body)
    assert _code(exc) == "non_finite_number"


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (float("inf"), "non_finite_number"),
        ({"a": [float("-inf")]}, "non_finite_number"),
        ({"a": float("nan")}, "non_finite_number"),
        ({"account_id": 9007199254740993}, "unsafe_integer"),
        ([-(2**53)], "unsafe_integer"),
        (2**64, "unsafe_integer"),
    ],
)
def test_k20_check_hashable_rejects_numbers(value: Any, code: str) -> None:
    with pytest.raises(InvalidJSON) as exc:
        check_hashable(value)
    assert _code(exc) == code
    with pytest.raises(InvalidJSON) as exc:
        args_hash(value)
    assert _code(exc) == code


def test_k20_detail_has_pointer_not_value() -> None:
    with pytest.raises(InvalidJSON) as exc:
        check_hashable({"x": [0, {"a/b~c": 9007199254740993}]})
    assert exc.value.extra["pointer"] == "/x/1/a~1b~0c"
    assert "/x/1/a~1b~0c" in exc.value.detail
    assert "9007199254740993" not in exc.value.detail


def test_k20_large_float_literal_is_a_double_not_an_integer() -> None:
    # Floats are IEEE doubles (RFC 8785); only integer *literals* are range-checked.
    assert canonicalize(parse_json("1e20")) == b"100000000000000000000"
    # Known asymmetry: that canonical output, sent back as a body, is an unsafe integer literal.
    with pytest.raises(InvalidJSON) as exc:
        parse_json(canonicalize(1e20))
    assert _code(exc) == "unsafe_integer"


# --------------------------------------------------------------------- duplicate keys, syntax


@pytest.mark.parametrize(
    "body",
    [
        '{"a": 1, "a": 1}',
        '{"a": 1, "a": 2}',
        '{"x": [{"k": 1, "k": 2}]}',
        '{"a\\u005fb": 1, "a_b": 2}',
        '{"\\u00e9": 1, "é": 2}',
    ],
)
def test_duplicate_keys_rejected(body: str) -> None:
    with pytest.raises(InvalidJSON) as exc:
        parse_json(body)
    assert _code(exc) == "duplicate_key"
    assert exc.value.extra["key"] in exc.value.detail


def test_duplicate_key_detail_names_key_only() -> None:
    with pytest.raises(InvalidJSON) as exc:
        parse_json('{"pin": "1234", "pin": "5678"}')
    assert "pin" in exc.value.detail
    assert "1234" not in exc.value.detail and "5678" not in exc.value.detail


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"{'a': 1}",
        b'{"a": 1,}',
        b"[1] [2]",
        b'{"a": 01}',
        b'"\x01"',
        b"\xff",
        b'{"a": "\xc3"}',
        b'"\xed\xa0\x80"',  # CESU-8 encoded surrogate
        b"\xef\xbb\xbf{}",  # BOM
        '{"a": 1}'.encode("utf-16"),
        "\u0661".encode(),  # non-ASCII digit
        b"[" * 100_000 + b"]" * 100_000,
    ],
)
def test_invalid_json_rejected(body: bytes) -> None:
    with pytest.raises(InvalidJSON) as exc:
        parse_json(body)
    assert _code(exc) == "invalid_json"


@pytest.mark.parametrize(
    "body",
    [
        '"\\ud800"',
        '["ok", "x\\udfffy"]',
        '{"a": {"b": "\\uD83D"}}',
        '{"\\ud800": 1}',
        '"\\ude00\\ud83d"',  # reversed pair
        '"\ud800"',  # raw lone surrogate in a str body
    ],
)
def test_lone_surrogates_rejected(body: str) -> None:
    with pytest.raises(InvalidJSON) as exc:
        parse_json(body)
    assert _code(exc) == "invalid_json"
    assert "\ud800" not in exc.value.detail and "\udfff" not in exc.value.detail


def test_lone_surrogate_pointer() -> None:
    with pytest.raises(InvalidJSON) as exc:
        parse_json('{"a": [1, "\\udc00"]}')
    assert exc.value.extra["pointer"] == "/a/1"


def test_surrogate_pair_and_escaped_backslash_accepted() -> None:
    assert parse_json('"\\ud83d\\ude00"') == "😀"
    assert parse_json('"\\\\ud800"') == "\\ud800"  # an escaped backslash, not a surrogate


def test_parse_json_rejects_non_text_types() -> None:
    with pytest.raises(TypeError):
        parse_json(123)  # type: ignore[arg-type]


# ------------------------------------------------------------------ K25 / K03: types as sent


def test_k25_parse_keeps_json_types() -> None:
    value = parse_json('{"i": 100000, "f": 100000.0, "b": true, "s": "100000", "n": null}')
    assert type(value["i"]) is int and type(value["f"]) is float
    assert value["b"] is True and value["s"] == "100000" and value["n"] is None


def test_k25_distinct_types_hash_differently() -> None:
    hashes = {
        args_hash({"amount_minor": 1}),
        args_hash({"amount_minor": True}),
        args_hash({"amount_minor": "1"}),
        args_hash({"amount_minor": None}),
        args_hash({"amount_minor": [1]}),
    }
    assert len(hashes) == 5
    assert args_hash({"amount_minor": 0}) != args_hash({"amount_minor": False})


def test_k03_missing_null_and_string_args_hash_differently() -> None:
    obj = {"amount_minor": 100}
    assert args_hash(obj) != args_hash({"amount_minor": 100, "currency": None})
    assert args_hash(obj) != args_hash(json.dumps(obj))
    assert args_hash(None) == hash_bytes(b"null")


@pytest.mark.parametrize(
    "value",
    [
        (1, 2),
        {1: "a"},
        {"a": {1, 2}},
        b"bytes",
        OrderedDict(a=1),
        {"a": "\ud800"},
        {"\udfff": 1},
        object(),
    ],
)
def test_check_hashable_rejects_non_json(value: Any) -> None:
    with pytest.raises(InvalidJSON) as exc:
        canonicalize(value)
    assert _code(exc) == "invalid_json"


def test_deep_nesting_is_invalid_json_not_crash() -> None:
    value: Any = 0
    for _ in range(100_000):
        value = [value]
    with pytest.raises(InvalidJSON) as exc:
        canonicalize(value)
    assert _code(exc) == "invalid_json"


# --------------------------------------------------------------------------- property tests

_SAFE_INTS = st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
# Floats in [2**53, 1e21) canonicalise to integer literals that parse_json refuses (see the
# module docstring); they are covered by test_k20_large_float_literal_is_a_double_not_an_integer.
_FLOATS = st.floats(allow_nan=False, allow_infinity=False).filter(
    lambda f: not 2**53 <= abs(f) < 1e21
)
_TEXT = st.text(alphabet=st.characters(codec="utf-8"))  # includes non-BMP, never surrogates
_JSON = st.recursive(
    st.none() | st.booleans() | _SAFE_INTS | _FLOATS | _TEXT,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(_TEXT, children, max_size=5),
    max_leaves=30,
)


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_property_canonical_round_trip(value: Any) -> None:
    canonical = canonicalize(value)
    assert canonicalize(parse_json(canonical)) == canonical
    assert canonicalize(parse_json(canonical.decode("utf-8"))) == canonical
    # A non-canonical serialisation of the same value gives the same bytes.
    loose = json.dumps(value, ensure_ascii=True, indent=1)
    assert canonicalize(parse_json(loose)) == canonical


@settings(max_examples=200, deadline=None)
@given(_JSON, st.randoms(use_true_random=False))
def test_property_key_order_never_changes_hash(value: Any, rng: random.Random) -> None:
    assert args_hash(_shuffled(value, rng)) == args_hash(value)
    reordered = json.dumps(_shuffled(value, rng), ensure_ascii=False)
    assert args_hash(parse_json(reordered.encode())) == args_hash(value)


@given(_FLOATS)
def test_property_float_text_round_trips_exactly(value: float) -> None:
    parsed = parse_json(canonicalize(value))
    assert float(parsed) == value or (value == 0 and parsed == 0)
    assert not isinstance(parsed, float) or math.isfinite(parsed)


# --- the fast path (stdlib C encoder) is byte-identical to the rfc8785 package -----------

_text = st.text(
    alphabet=st.characters(
        codec="utf-8",  # excludes lone surrogates
        categories=None,
    ),
    max_size=12,
) | st.sampled_from(["\x00", "\x1f", "\x7f", "\u2028", '"', "\\", "\b\f\n\r\t", "\ue000",
                     "\U0001f600", "é", "/"])
_safe_ints = st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
_floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [1e-7, 1e20, 1e21, -0.0, 0.000001, 5e-324, 1.7976931348623157e308, 100000.0])
_no_float_json = st.recursive(
    st.none() | st.booleans() | _safe_ints | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=20,
)
_any_json = st.recursive(
    st.none() | st.booleans() | _safe_ints | _floats | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(_no_float_json)
def test_fast_path_is_byte_identical_to_rfc8785(value: object) -> None:
    assert canonical.canonicalize(value) == rfc8785.dumps(value)


@settings(max_examples=400, deadline=None)
@given(_any_json)
def test_canonicalize_is_byte_identical_to_rfc8785_on_any_json(value: object) -> None:
    assert canonical.canonicalize(value) == rfc8785.dumps(value)


def test_fast_path_is_taken_only_without_floats_or_non_bmp_keys() -> None:
    assert canonical._checked({"a": [1, "x", None, True]}) is True
    assert canonical._checked({"a": 1.5}) is False
    assert canonical._checked({"\U0001f600": 1}) is False
    assert canonical._checked({"k": "\U0001f600"}) is True  # non-BMP *values* are fine
