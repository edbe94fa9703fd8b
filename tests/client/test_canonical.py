"""Client and server canonical forms agree (K19, K20): shared golden vectors, a property
test over generated JSON, and strict refusals raised before any network call."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
from cosigner_client import Gate, InvalidArguments, from_anthropic, from_openai
from cosigner_client import canonical as client
from hypothesis import given, settings
from hypothesis import strategies as st

from cosigner.core import canonical as server
from cosigner.core.errors import InvalidJSON

VECTORS = json.loads((Path(__file__).parent.parent / "canonical_vectors.json")
                     .read_text("utf-8"))


@pytest.mark.parametrize("vector", VECTORS["accept"], ids=lambda v: v["description"])
def test_client_matches_golden_vector(vector: dict[str, Any]) -> None:
    value = client.parse_json(vector["json"])
    assert client.canonicalize(value) == vector["canonical"].encode("utf-8")
    assert client.args_hash(value) == vector["hash"]


@pytest.mark.parametrize("vector", VECTORS["reject"], ids=lambda v: v["description"])
def test_client_rejects_golden_vector(vector: dict[str, Any]) -> None:
    with pytest.raises(InvalidArguments) as info:
        client.parse_json(vector["json"])
    assert info.value.code == vector["code"]


SAFE = 2**53 - 1
keys = st.text(max_size=8)
scalars = (st.none() | st.booleans() | st.integers(-SAFE, SAFE)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(keys, inner, max_size=4), max_leaves=20)
anything = st.recursive(
    scalars | st.integers() | st.floats() | st.characters(min_codepoint=0xD800,
                                                          max_codepoint=0xDFFF),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        keys | st.integers(0, 3) | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
        inner, max_size=3), max_leaves=10)


@settings(max_examples=500, deadline=None)
@given(json_values)
def test_client_canonical_equals_server_on_generated_json(value: Any) -> None:
    assert client.canonicalize(value) == server.canonicalize(value)
    assert client.args_hash(value) == server.args_hash(value)


@settings(max_examples=500, deadline=None)
@given(anything)
def test_client_refuses_exactly_what_server_refuses(value: Any) -> None:
    try:
        expected: bytes | str = server.canonicalize(value)
    except InvalidJSON as exc:
        expected = exc.code
    try:
        got: bytes | str = client.canonicalize(value)
    except InvalidArguments as exc:
        got = exc.code
    assert got == expected


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_client_parse_agrees_with_server_on_generated_text(value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False)
    assert client.args_hash(client.parse_json(text)) == server.args_hash(
        server.parse_json(text.encode()))


def _no_network(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"network call made: {request.url}")


@pytest.mark.parametrize(("args", "code"), [
    ({"account_id": 9007199254740993}, "unsafe_integer"),  # K20
    ({"amount": float("inf")}, "non_finite_number"),  # K20
    ({"amount": math.nan}, "non_finite_number"),
    ({1: "x"}, "invalid_json"),
    ({"name": "\ud800"}, "invalid_json"),
    ({"ids": (1, 2)}, "invalid_json"),
])
def test_gate_raises_before_any_network_call(args: dict[Any, Any], code: str) -> None:
    with Gate("http://127.0.0.1:9", "csk_x", run="r", principal="p", initiator="i",
              transport=httpx.MockTransport(_no_network)) as gate:
        with pytest.raises(InvalidArguments) as info:
            gate.decide("issue_refund", args)
        assert info.value.code == code
        with pytest.raises(InvalidArguments):
            gate.redeem("a.b.c", "issue_refund", args)
        with pytest.raises(InvalidArguments):
            gate.decide("get_order", {"order_id": "ord_1"}, context={"score": math.inf})


def test_openai_function_call_is_parsed_strictly() -> None:
    call = from_openai({"name": "issue_refund",
                        "arguments": '{"order_id":"ord_8472","amount_minor":200000}'})
    assert (call.name, call.args) == ("issue_refund",
                                      {"order_id": "ord_8472", "amount_minor": 200000})
    nested = from_openai({"id": "call_1", "type": "function", "function": {
        "name": "get_order", "arguments": '{"order_id":"ord_1"}'}})
    assert (nested.id, nested.name) == ("call_1", "get_order")
    for bad, code in [('{"a":1,"a":2}', "duplicate_key"), ('{"a":NaN}', "non_finite_number"),
                      ('{"id":9007199254740993}', "unsafe_integer"), ("[1]", "invalid_tool_call")]:
        with pytest.raises(InvalidArguments) as info:
            from_openai({"name": "t", "arguments": bad})
        assert info.value.code == code
    with pytest.raises(InvalidArguments):
        from_openai({"name": "t", "arguments": {"already": "parsed"}})


def test_anthropic_tool_use_block() -> None:
    block = {"type": "tool_use", "id": "toolu_1", "name": "get_order",
             "input": {"order_id": "ord_8472"}}
    call = from_anthropic(block)
    assert (call.id, call.name, call.args) == ("toolu_1", "get_order", {"order_id": "ord_8472"})
    for bad in ({**block, "type": "text"}, {**block, "input": "{}"},
                {**block, "name": ""}, {**block, "input": {"n": 2**60}}):
        with pytest.raises(InvalidArguments):
            from_anthropic(bad)
