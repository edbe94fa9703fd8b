"""Session 13 adversarial probes of the Rego result memo: modules that read the clock
through spellings the purity scan did not see must never be answered from the memo."""

from __future__ import annotations

import pytest

from cosigner.policy.rego_engine import RegoEngine
from cosigner.policy.rego_memo import is_pure


@pytest.mark.parametrize("call", [
    "time. # a comment\n  now_ns()",
    "time # a comment\n  .now_ns()",
    '$"{time.now_ns()}"',
    "$`{time.now_ns()}`",
    'time["now_ns"]()',
    'time[ "now_ns" ] ( )',
])
def test_s13_clock_read_through_a_spelling_the_scan_missed(call: str) -> None:
    """rego-cpp 1.5.2 runs each spelling as a call of ``time.now_ns``: the modules are
    impure, and every evaluation reads the clock again (before the fix: one remembered
    value for every later evaluation of the same input)."""
    source = ('package cosigner.test\n\nimport rego.v1\n\n'
              'decision := {"effect": "allow", "reasons": [sprintf("%v", [x])], '
              f'"a": input.a}}\n\nx := {call}\n')
    assert not is_pure({"p.rego": source})
    engine = RegoEngine.from_files({"p.rego": source.encode()},
                                   entrypoint="data.cosigner.test.decision", where="t")
    assert engine.memo is None
    seen = {engine.evaluate_sync({"a": 1})["reasons"][0] for _ in range(3)}
    assert len(seen) == 3


def test_s13_strings_and_comments_that_only_look_opaque_stay_pure() -> None:
    """Brackets in a reference that is not called, and ``$`` or ``](`` inside strings and
    comments, do not make modules impure."""
    assert is_pure({"a.rego": 'package a\n\nx := input.a[0]\ny := "$\\"{time.now_ns()}"\n'
                              '# f]( and $"\nz := count(input.b["c"])\n'})


@pytest.mark.parametrize("body", [
    "deny if {\n  x := `#`; input.args.amount > 100\n}\n",
    "deny if {\n  x := `a\n#`; input.args.amount > 100\n}\n",
])
def test_s13_an_input_member_read_after_a_hash_in_a_raw_string_is_passed(body: str) -> None:
    """The members the memo is keyed by (and rego-cpp is given) are those
    ``input_keys`` finds; a ``#`` inside a raw string starts no comment, so ``input.args``
    after it is read. Before the fix ``args`` was dropped from the input and the deny
    rule could not fire: allow (fail open)."""
    source = ('package cosigner.test\n\nimport rego.v1\n\n'
              'default decision := {"effect": "allow"}\n'
              'decision := {"effect": "deny"} if deny\n' + body)
    engine = RegoEngine.from_files({"p.rego": source.encode()},
                                   entrypoint="data.cosigner.test.decision", where="t")
    for _ in range(2):  # rego-cpp, then the memo
        assert engine.evaluate_sync({"args": {"amount": 500}}) == {"effect": "deny"}
        assert engine.evaluate_sync({"args": {"amount": 5}}) == {"effect": "allow"}


def test_s13_threads_and_a_full_memo_give_rego_cpps_answers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads evaluate inputs equal as JSON text but not as values (1, 1.0, true,
    "1"; key orders) on one engine whose memo is cleared every few entries: every answer
    is what an engine without a memo gives for that input."""
    from concurrent.futures import ThreadPoolExecutor

    from cosigner.policy import rego_memo

    monkeypatch.setattr(rego_memo, "MAX_ENTRIES", 3)
    source = ('package cosigner.test\n\nimport rego.v1\n\n'
              'decision := {"effect": "allow", "reasons": [json.marshal(input.a), '
              'sprintf("%v", [input.a])]}\n')
    engine = RegoEngine.from_files({"p.rego": source.encode()},
                                   entrypoint="data.cosigner.test.decision", where="t")
    plain = RegoEngine.from_files({"p.rego": source.encode()},
                                  entrypoint="data.cosigner.test.decision", where="t")
    plain.memo = None
    assert engine.memo is not None
    inputs: list[dict[str, object]] = [
        {"a": 1}, {"a": 1.0}, {"a": True}, {"a": "1"}, {"a": {"x": 1, "y": 2}},
        {"a": {"y": 2, "x": 1}}, {"a": "x"}, {"a": None}]
    expected = [plain.evaluate_sync(doc) for doc in inputs]

    def run(seed: int) -> list[bool]:
        return [engine.evaluate_sync(inputs[(seed + i) % len(inputs)])
                == expected[(seed + i) % len(inputs)] for i in range(200)]

    with ThreadPoolExecutor(8) as pool:
        assert all(all(ok) for ok in pool.map(run, range(8)))
