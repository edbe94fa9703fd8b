"""The Rego engine's result memo (cosigner/policy/rego_memo.py) answers as rego-cpp does.

For pure modules, a sequence of evaluations (inputs repeated, reordered, of every JSON
type) gives the same outcomes, values with their key order and errors alike, as the same
engine with the memo set aside; a repeated input is answered without rego-cpp; modules
calling a built-in that reads the clock, randomness or the network are never
remembered; errors are never remembered; the memo stays within its bounds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cosigner.policy import rego_engine as rego_engine_module
from cosigner.policy import rego_memo
from cosigner.policy.rego_engine import RegoEngine
from cosigner.policy.rego_memo import ResultMemo, is_pure
from tests.policy.conftest import REFUNDS_REGO, rego_engine
from tests.policy.test_rego_policy_equivalence import docs, json_value, refund_calls

MCP = REFUNDS_REGO.parent / "mcp_filesystem"

# Reads the input's shape: key order (object.keys keeps rego-cpp's insertion order),
# types (1 and 1.0 and true), strings, nesting; errors on some inputs (a builtin error,
# a conflict), undefined on others.
SHAPES = """package cosigner.test

decision := {"effect": "allow", "reasons": [sprintf("%v", [input.a]), type_name(input.a)],
             "mask": [k | some k in object.keys(input.b)]} if input.a != "undefined"

decision := {"effect": "deny", "permit_ttl_s": 1 / input.c} if input.c

decision := {"effect": "allow", "n": count(input.b)} if input.a == "conflict"
"""


def bundle_engine(folder: Path, entrypoint: str) -> RegoEngine:
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    return RegoEngine.from_files(files, entrypoint=entrypoint, where=str(folder))


@pytest.fixture(scope="module")
def engines() -> dict[str, RegoEngine]:
    return {"refunds": bundle_engine(REFUNDS_REGO, "data.cosigner.refunds.decision"),
            "mcp": bundle_engine(MCP, "data.cosigner.mcp_filesystem.decision"),
            "shapes": rego_engine(SHAPES)}


def outcome(call: Any) -> tuple[str, Any]:
    """The value as JSON text (key order counts) or the exception's type and text."""
    try:
        return ("ok", json.dumps(call()))
    except Exception as exc:
        return ("error", f"{type(exc).__name__}: {exc}")


def fresh(engine: RegoEngine, doc: dict[str, Any]) -> tuple[str, Any]:
    """The outcome of evaluating ``doc`` by rego-cpp, the memo set aside."""
    memo, engine.memo = engine.memo, None
    try:
        return outcome(lambda: engine.evaluate_sync(doc))
    finally:
        engine.memo = memo


shape_docs = st.fixed_dictionaries({}, optional={
    "a": json_value | st.sampled_from(["undefined", "conflict", 1, 1.0, True, "1"]),
    "b": st.dictionaries(st.text(max_size=2), json_value, max_size=4) | json_value,
    "c": st.sampled_from([0, 1, 2, 0.0, False, None])})


def reordered(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with the keys of every object in reverse order (equal, not the same)."""
    def walk(value: Any) -> Any:
        if type(value) is dict:
            return {k: walk(value[k]) for k in reversed(list(value))}
        if type(value) is list:
            return [walk(v) for v in value]
        return value
    return walk(doc)


@settings(max_examples=300)
@given(name=st.sampled_from(["refunds", "mcp", "shapes"]), data=st.data())
def test_remembered_answers_are_rego_cpps(engines: dict[str, RegoEngine], name: str,
                                          data: st.DataObject) -> None:
    engine = engines[name]
    assert engine.memo is not None
    pool = st.one_of(docs, refund_calls) if name != "shapes" else shape_docs
    seen = data.draw(st.lists(pool, min_size=1, max_size=4))
    order = data.draw(st.lists(st.sampled_from(range(len(seen))), min_size=2, max_size=12))
    for index in order:
        doc = seen[index]
        if data.draw(st.booleans()):
            doc = reordered(doc)
        assert outcome(lambda d=doc: engine.evaluate_sync(d)) == fresh(engine, doc), doc


def test_key_order_and_types_are_told_apart(engines: dict[str, RegoEngine]) -> None:
    engine = engines["shapes"]
    for doc in [{"a": 1, "b": {"x": 1, "y": 2}}, {"a": 1, "b": {"y": 2, "x": 1}},
                {"a": True, "b": {}}, {"a": 1.0, "b": {}}, {"a": "1", "b": {}},
                {"b": {}, "a": 1}]:
        for _ in range(2):
            assert outcome(lambda d=doc: engine.evaluate_sync(d)) == fresh(engine, doc)
    ab = engine.evaluate_sync({"a": 1, "b": {"x": 1, "y": 2}})
    ba = engine.evaluate_sync({"a": 1, "b": {"y": 2, "x": 1}})
    assert (ab["mask"], ba["mask"]) == (["x", "y"], ["y", "x"])  # rego-cpp keeps the order


def test_a_repeated_input_is_answered_without_rego_cpp(
        monkeypatch: pytest.MonkeyPatch) -> None:
    engine = bundle_engine(REFUNDS_REGO, "data.cosigner.refunds.decision")
    calls: list[bytes] = []
    query = rego_engine_module.query_entrypoint

    def counted(*args: Any) -> Any:
        calls.append(args[2])
        return query(*args)

    monkeypatch.setattr(rego_engine_module, "query_entrypoint", counted)
    doc = {"tenant": "t1", "tool": {"name": "issue_refund"},
           "args": {"amount_minor": 5000, "currency": "USD"}}
    first = engine.evaluate_sync(doc)
    again = engine.evaluate_sync(dict(doc, tenant="t2", request_id="other"))  # not read
    assert first == again and first["effect"] == "allow"
    assert first is not again  # a fresh value each time: a caller may change its own
    assert len(calls) == 1
    engine.evaluate_sync(dict(doc, args={"amount_minor": 5001, "currency": "USD"}))
    assert len(calls) == 2


@pytest.mark.parametrize("call", [
    "time.now_ns()", 'rand.intn("k", 100)', 'uuid.rfc4122("k")',
    'http.send({"method": "get", "url": "http://127.0.0.1:1"})',
    'io.jwt.decode_verify("x", {"secret": "s"})', "opa.runtime()",
    'net.lookup_ip_addr("localhost")', "lib.helper(1)",  # an imported alias: unknown
    "time . now_ns ( )",
])
def test_modules_calling_an_impure_builtin_are_never_remembered(call: str) -> None:
    source = f'package cosigner.test\n\ndecision := {{"effect": "allow", "x": {call}}}\n'
    assert not is_pure({"p.rego": source})


def test_the_clock_is_read_on_every_evaluation() -> None:
    engine = rego_engine('package cosigner.test\n\ndecision := {"effect": "allow", '
                         '"reasons": [sprintf("%v", [time.now_ns()])], "a": input.a}\n')
    assert engine.memo is None
    seen = {engine.evaluate_sync({"a": 1})["reasons"][0] for _ in range(3)}
    assert len(seen) == 3


def test_pure_modules_and_calls_in_strings_or_comments() -> None:
    assert is_pure({"r.rego": (REFUNDS_REGO / "refunds.rego").read_text()})
    assert is_pure({"a.rego": 'package a\n\n# time.now_ns() in a comment\n'
                              'x := "time.now_ns()"\ny := `http.send(1)`\n'
                              'z := data.lib.f(1)\nw := object.get(input, "a", 1)\n'
                              'v := count([1]) + my_function(2)\n'})
    assert not is_pure({"a.rego": 'package a\n\nx := "a#b" # a string, then\n'
                                  "y := time.now_ns()\n"})


@pytest.mark.parametrize("source", [
    'decision := {"effect": "allow"} if input.a\ndecision := {"effect": "deny"} if input.a\n',
    'decision := {"effect": "allow", "permit_ttl_s": 1 / input.zero}\n',
])
def test_errors_are_never_remembered(source: str) -> None:
    engine = rego_engine("package cosigner.test\n\n" + source)
    assert engine.memo is not None
    for _ in range(2):
        with pytest.raises(Exception, match="Rego evaluation failed"):
            engine.evaluate_sync({"a": True, "zero": 0})
    assert len(engine.memo) == 0


def test_the_memo_stays_within_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rego_memo, "MAX_ENTRIES", 3)
    monkeypatch.setattr(rego_memo, "MAX_BYTES", 40)
    memo = ResultMemo()
    for key in [b"1", b"2", b"3"]:
        memo.put(key, "t")
    assert len(memo) == 3
    memo.put(b"4", "t")  # a fourth entry: everything forgotten first
    assert (len(memo), memo.get(b"1"), memo.get(b"4")) == (1, None, "t")
    memo.put(b"5" * 30, "t" * 9)  # past 40 bytes: forgotten first again
    assert (len(memo), memo.get(b"4")) == (1, None)
    memo.put(b"k" * (rego_memo.MAX_KEY_BYTES + 1), "t")
    assert len(memo) == 1  # too large a key is not remembered


def test_an_input_without_an_exact_key_is_not_remembered() -> None:
    engine = rego_engine('package cosigner.test\n\ndecision := {"effect": "allow", '
                         '"reasons": [sprintf("%v", [input.a])]}\n')
    assert engine.memo is not None
    for value in [1.5, 2**60, "xé"]:
        engine.evaluate_sync({"a": value})
    assert len(engine.memo) == 1  # the float and the integer beyond 2**53: no key
