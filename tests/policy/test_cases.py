"""Golden cases: the refund policy gives identical effects on the Python and Rego engines,
and a bundle's own cases and Rego test rules gate its loading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cosigner.core.errors import PolicyError
from cosigner.policy.bundle import Bundle
from cosigner.policy.cases import (
    DEFAULT_INPUT,
    check_bundle,
    evaluate_case,
    load_cases,
    run_cases,
    test_bundle,
    with_defaults,
)
from cosigner.policy.store import PolicyStore, run_bundle
from tests.policy.conftest import REFUNDS_PY, REFUNDS_REGO, manifest, write_bundle

GOLDEN = load_cases((REFUNDS_PY / "cases.yaml").read_bytes(), where="cases.yaml")


@pytest.fixture(scope="module")
def engines() -> dict[str, Bundle]:
    store = PolicyStore([])
    return {"python": store.load_bundle(REFUNDS_PY), "rego": store.load_bundle(REFUNDS_REGO)}


def test_both_refund_bundles_share_one_case_file_and_one_catalogue() -> None:
    for name in ("cases.yaml", "tools.yaml"):
        assert (REFUNDS_REGO / name).read_bytes() == (REFUNDS_PY / name).read_bytes()


@pytest.mark.parametrize("case", GOLDEN, ids=[c.description for c in GOLDEN])
async def test_golden_case_gives_identical_effects_on_both_engines(
    engines: dict[str, Bundle], case: Any
) -> None:
    got = {name: await evaluate_case(bundle, case.input) for name, bundle in engines.items()}
    assert got["python"].effect == got["rego"].effect == case.effect
    assert [r.code for r in got["python"].reasons] == [r.code for r in got["rego"].reasons]
    assert got["python"].approval == got["rego"].approval
    if case.reason:
        assert case.reason in [r.code for r in got["rego"].reasons]


def refund(**args: Any) -> dict[str, Any]:
    return with_defaults({"tool": {"name": "issue_refund"}, "args": args})


@pytest.mark.parametrize(
    "args",
    [
        {"order_id": "ord_1", "amount_minor": 100},  # no currency
        {"order_id": "ord_1", "amount_minor": 100, "currency": None},
        {"order_id": "ord_1", "amount_minor": 100, "currency": "JPY"},
        {"order_id": "ord_1", "amount_minor": True, "currency": "USD"},  # K25 without catalogue
        {"order_id": "ord_1", "amount_minor": "100", "currency": "USD"},
        {"order_id": "ord_1", "amount_minor": -5, "currency": "USD"},
    ],
)
async def test_K03_policy_alone_never_allows_without_a_valid_currency_and_amount(
    engines: dict[str, Bundle], args: dict[str, Any]
) -> None:
    # run_bundle skips the catalogue: the rule itself must fail closed.
    for bundle in engines.values():
        result = await run_bundle(bundle, refund(**args))
        assert result.effect == "deny", bundle.id


def test_missing_input_fields_get_defaults() -> None:
    doc = with_defaults({"tool": {"name": "get_order"}, "run": {"step": 7}})
    assert set(doc) == set(DEFAULT_INPUT)
    assert doc["tool"] == {"name": "get_order"}
    assert doc["run"] == {"id": "run_1", "step": 7, "tool_calls": 0}
    assert doc["tenant"] == "t" and doc["context"] == {}


@pytest.mark.parametrize(
    "text",
    [
        "{a: 1}",
        "- {input: {}, want: {effect: permit}}",
        "- {input: {}}",
        "- {input: [], want: {effect: deny}}",
        "- {input: {}, want: {effect: deny, because: x}}",
        "- [",
    ],
)
def test_malformed_case_files_are_refused(text: str) -> None:
    with pytest.raises(PolicyError) as info:
        load_cases(text.encode(), where="b/cases.yaml")
    assert info.value.code == "policy_load_failed"


PY_RULES = """
def decide(input):
    if input["tool"]["name"] == "ok":
        return {"effect": "allow"}
    return {"effect": "deny", "reasons": ["nope"]}
"""


def py_bundle(tmp_path: Path, cases: str, rules: str = PY_RULES) -> Bundle:
    folder = write_bundle(
        tmp_path,
        "py",
        {
            "manifest.toml": manifest(
                id="py", engine="python", entrypoint="decide", extra='cases = "cases.yaml"\n'
            ),
            "rules.py": rules,
            "cases.yaml": cases,
        },
    )
    return PolicyStore([tmp_path]).load_bundle(folder)


async def test_a_failing_case_is_reported_with_what_was_wanted(tmp_path: Path) -> None:
    bundle = py_bundle(
        tmp_path,
        "- {description: good, input: {tool: {name: ok}}, "
        "want: {effect: allow}}\n"
        "- {description: bad, input: {tool: {name: x}}, "
        "want: {effect: allow}}\n"
        "- {description: reason, input: {tool: {name: x}}, "
        "want: {effect: deny, reason: other}}\n",
    )
    results = await run_cases(bundle)
    assert [r.passed for r in results] == [True, False, False]
    assert "want effect allow, got deny" in results[1].message
    assert "want reason other" in results[2].message
    with pytest.raises(PolicyError) as info:
        check_bundle(bundle)
    assert "2 failing" in info.value.detail and "'bad'" in info.value.detail


async def test_check_bundle_works_from_inside_a_running_loop(tmp_path: Path) -> None:
    bundle = py_bundle(tmp_path, "- {input: {tool: {name: ok}}, want: {effect: allow}}\n")
    check_bundle(bundle)  # called on the loop thread: must not need the loop


@pytest.mark.parametrize(
    "rules",
    [
        'def decide(input):\n    return {"effect": "allow"} if input["missing"] else None\n',
        "def decide(input):\n    return None\n",
        'def decide(input):\n    return "allow"\n',
        'def decide(input):\n    return {"allowed": True}\n',
    ],
)
async def test_K04_python_rule_faults_deny(tmp_path: Path, rules: str) -> None:
    bundle = py_bundle(tmp_path, "[]", rules)
    result = await run_bundle(bundle, with_defaults({"tool": {"name": "ok"}}))
    assert result.effect == "deny"
    assert result.reasons[0].code in {"policy_error", "undefined"}


async def test_rego_bundle_report_includes_its_test_rules() -> None:
    bundle = PolicyStore([]).load_bundle(REFUNDS_REGO)
    report = await test_bundle(bundle)
    assert len(report.cases) == len(GOLDEN)
    assert len(report.rego_tests) >= 8
    assert report.failures == []
