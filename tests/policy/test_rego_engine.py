"""Embedded Rego engine (regopy): compile once, fail closed, file:line on errors."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cosigner.core.errors import PolicyError
from cosigner.policy.bundle import Bundle, Manifest
from cosigner.policy.rego_engine import RegoEngine, input_keys, run_rego_tests
from cosigner.policy.store import run_bundle
from tests.policy.conftest import REFUNDS_REGO, rego_engine

ENTRY = "data.cosigner.refunds.decision"


def refunds_engine() -> RegoEngine:
    files = {p.name: p.read_bytes() for p in REFUNDS_REGO.iterdir() if p.is_file()}
    return RegoEngine.from_files(files, entrypoint=ENTRY, where=str(REFUNDS_REGO))


def as_bundle(engine: RegoEngine) -> Bundle:
    manifest = Manifest(id="t", version="1", engine="rego", entrypoint=ENTRY, tenants=("*",))
    return Bundle(manifest=manifest, path=Path("t"), revision="sha256:0", engine=engine)


async def test_refund_policy_evaluates_to_the_documented_shape() -> None:
    engine = refunds_engine()
    got = await engine.evaluate(
        {
            "tool": {"name": "issue_refund"},
            "args": {
                "order_id": "ord_1",
                "amount_minor": 150000,
                "currency": "USD",
                "reason_code": "goodwill",
            },
        }
    )
    assert got["effect"] == "require_approval"
    assert got["approval"]["require"] == [{"role": "finance", "count": 1}]


def test_syntax_error_is_refused_with_file_and_line() -> None:
    source = 'package cosigner.test\n\ndecision := {"effect": "allow" if {\n'
    with pytest.raises(PolicyError) as info:
        rego_engine(source)
    assert info.value.code == "policy_load_failed"
    assert "policy.rego:3:" in info.value.detail


def test_entrypoint_no_module_declares_is_refused() -> None:
    with pytest.raises(PolicyError) as info:
        rego_engine("package cosigner.other\n\ndecision := 1\n")
    assert info.value.code == "policy_load_failed"
    assert "entrypoint" in info.value.detail


def test_malformed_entrypoint_is_refused() -> None:
    with pytest.raises(PolicyError):
        rego_engine("package cosigner.test\n\ndecision := 1\n", entrypoint="cosigner.test")


def test_a_bundle_that_crashes_rego_cpp_is_refused_and_the_server_survives() -> None:
    # rego-cpp 1.5.2 aborts the process on this valid Rego; the child process takes it.
    source = (
        "package cosigner.test\n\nok if input.a\n\ndecision := 1 if ok\n\n"
        'probe := 1 if { decision == 1 with input as {"a": true} }\n'
    )
    with pytest.raises(PolicyError) as info:
        rego_engine(source)
    assert info.value.code == "policy_load_failed"
    assert "crashed" in info.value.detail


async def test_K01_undefined_result_is_none_and_denies() -> None:
    engine = rego_engine(
        'package cosigner.test\n\ndecision := {"effect": "allow"} if '
        'input.tool.name == "get_order"\n'
    )
    input_doc = {"tool": {"name": "delete_customer"}, "args": {}}
    assert await engine.evaluate(input_doc) is None
    result = await run_bundle(as_bundle(engine), input_doc)
    assert (result.effect, result.reasons[0].code) == ("deny", "undefined")


@pytest.mark.parametrize(
    "value",
    [
        '"block"',
        "true",
        '"allow"',
        "1",
        "null",
        "[]",
        '{"allowed": true}',
        '{"effect": "ALLOW"}',
        '{"effect": "allow", "skip_approval": true}',
        '{"effect": "require_approval"}',
    ],
)
async def test_K04_every_wrong_result_shape_denies_with_policy_error(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = rego_engine(f"package cosigner.test\n\ndecision := {value}\n")
    result = await run_bundle(as_bundle(engine), {"tool": {"name": "x"}, "args": {}})
    assert (result.effect, result.reasons[0].code) == ("deny", "policy_error")
    assert any(r.levelname == "ERROR" and "t@1" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "source",
    [
        # complete rule with two different values: a conflict, not "first wins"
        'decision := {"effect": "allow"} if input.a\ndecision := {"effect": "deny"} if input.a\n',
        # builtin error (strict): not silently undefined
        'decision := {"effect": "allow", "permit_ttl_s": 1 / input.zero}\n',
    ],
)
async def test_evaluation_errors_raise_policy_error_and_deny(source: str) -> None:
    engine = rego_engine("package cosigner.test\n\n" + source)
    input_doc = {"a": True, "zero": 0}
    with pytest.raises(PolicyError) as info:
        await engine.evaluate(input_doc)
    assert info.value.code == "policy_error"
    result = await run_bundle(as_bundle(engine), input_doc)
    assert (result.effect, result.reasons[0].code) == ("deny", "policy_error")


def test_only_the_input_keys_the_modules_read_are_passed() -> None:
    assert input_keys({"a": 'x := input.tool.name\ny := input["args"]\n'}) == {"tool", "args"}
    assert input_keys({"a": "x := f(input)\n"}) is None  # opaque use: the full document
    assert input_keys({"a": "# with input as {}\nx := input.tool\n"}) == {"tool"}
    assert input_keys({"a": open(REFUNDS_REGO / "refunds.rego").read()}) == {"tool", "args"}


async def test_projection_does_not_hide_fields_a_policy_reads() -> None:
    engine = rego_engine(
        'package cosigner.test\n\ndecision := {"effect": "allow"} if input.context.ok == true\n'
    )
    assert await engine.evaluate({"context": {"ok": True}, "tool": {}}) == {"effect": "allow"}


def test_evaluations_from_several_threads_never_mix_inputs() -> None:
    engine = rego_engine(
        'package cosigner.test\n\ndecision := {"effect": "allow", "reasons": [input.tool.name]}\n'
    )
    errors: list[str] = []

    def worker(n: int) -> None:
        for i in range(100):
            name = f"t{n}_{i}"
            got = engine.evaluate_sync({"tool": {"name": name}})
            if got["reasons"] != [name]:
                errors.append(f"{name}: {got}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_rego_test_rules_of_the_refund_bundle_pass() -> None:
    files = {p.name: p.read_bytes() for p in REFUNDS_REGO.iterdir() if p.is_file()}
    results = run_rego_tests(files, where="rego/refunds")
    assert len(results) >= 8
    assert [r.name for r in results if not r.passed] == []


def test_a_failing_rego_test_rule_is_reported() -> None:
    files = {
        "p.rego": b"package cosigner.test\n\nf(x) := x + 1\n",
        "p_test.rego": b"package cosigner.test_test\n\nimport data.cosigner.test\n\n"
        b"test_good if test.f(1) == 2\n\ntest_bad if test.f(1) == 3\n",
    }
    results = {r.name.rsplit(".", 1)[1]: r.passed for r in run_rego_tests(files, where="b")}
    assert results == {"test_good": True, "test_bad": False}
