"""Tool catalogue: JSON Schema (draft 2020-12) checks before any policy runs."""

from __future__ import annotations

from typing import Any

import pytest

from cosigner.core.errors import InvalidArgs, PolicyError
from cosigner.policy.catalogue import ToolCatalogue, load_catalogue
from tests.policy.conftest import REFUNDS_PY

VALID_REFUND = {
    "order_id": "ord_8472",
    "amount_minor": 5000,
    "currency": "USD",
    "reason_code": "duplicate_charge",
}


@pytest.fixture(scope="module")
def refunds() -> ToolCatalogue:
    files = {"tools.yaml": (REFUNDS_PY / "tools.yaml").read_bytes()}
    return load_catalogue(files, "tools.yaml", where=str(REFUNDS_PY))


def errors_of(catalogue: ToolCatalogue, tool: str, args: Any) -> list[dict[str, str]]:
    spec = catalogue.lookup(tool)
    assert spec is not None
    with pytest.raises(InvalidArgs) as info:
        spec.validate(args)
    assert info.value.code == "invalid_args"
    errors: list[dict[str, str]] = info.value.extra["errors"]
    return errors


def test_refund_catalogue_names_every_tool_with_its_side_effect(refunds: ToolCatalogue) -> None:
    assert {name: spec.side_effect for name, spec in refunds.tools.items()} == {
        "get_order": "read",
        "get_payment_events": "read",
        "get_refund_status": "read",
        "search_policy": "read",
        "issue_refund": "financial",
    }


def test_valid_arguments_pass(refunds: ToolCatalogue) -> None:
    spec = refunds.lookup("issue_refund")
    assert spec is not None
    spec.validate(VALID_REFUND)
    get_order = refunds.lookup("get_order")
    assert get_order is not None
    get_order.validate({"order_id": "ord_AbC123"})


def test_unknown_tool_is_not_in_the_catalogue(refunds: ToolCatalogue) -> None:
    assert refunds.lookup("delete_customer") is None


@pytest.mark.parametrize("amount", [True, "100000", 100000.0, 1.5, None, [1]])
def test_K25_amount_must_be_a_strict_integer(refunds: ToolCatalogue, amount: Any) -> None:
    errors = errors_of(refunds, "issue_refund", {**VALID_REFUND, "amount_minor": amount})
    assert [e["path"] for e in errors] == ["/amount_minor"]


def test_K25_unknown_fields_are_rejected(refunds: ToolCatalogue) -> None:
    errors = errors_of(refunds, "issue_refund", {**VALID_REFUND, "skip_approval": True})
    assert errors[0]["path"] == ""
    assert "skip_approval" in errors[0]["message"]


@pytest.mark.parametrize("amount", [-5, 0])
def test_K27_non_positive_amount_is_rejected(refunds: ToolCatalogue, amount: int) -> None:
    errors = errors_of(refunds, "issue_refund", {**VALID_REFUND, "amount_minor": amount})
    assert [e["path"] for e in errors] == ["/amount_minor"]


def test_K03_missing_currency_is_rejected(refunds: ToolCatalogue) -> None:
    args = {k: v for k, v in VALID_REFUND.items() if k != "currency"}
    errors = errors_of(refunds, "issue_refund", args)
    assert "currency" in errors[0]["message"]


@pytest.mark.parametrize("args", [None, '{"order_id": "ord_1"}', [], 5])
def test_K03_null_or_string_args_are_rejected(refunds: ToolCatalogue, args: Any) -> None:
    assert errors_of(refunds, "get_order", args)


def test_every_violation_is_listed_with_a_json_pointer(refunds: ToolCatalogue) -> None:
    errors = errors_of(
        refunds,
        "issue_refund",
        {"order_id": "ORD-1", "amount_minor": -5, "currency": "JPY", "reason_code": "because"},
    )
    assert [e["path"] for e in errors] == [
        "/amount_minor",
        "/currency",
        "/order_id",
        "/reason_code",
    ]
    assert all(e["message"] for e in errors)


def test_pattern_and_length_limits(refunds: ToolCatalogue) -> None:
    assert errors_of(refunds, "get_order", {"order_id": "ord_" + "a" * 33})
    assert errors_of(refunds, "get_order", {"order_id": "ord_1\n"})
    assert errors_of(refunds, "search_policy", {"query": "x" * 501})


def _catalogue(text: str) -> ToolCatalogue:
    return load_catalogue({"tools.yaml": text.encode()}, "tools.yaml", where="b")


@pytest.mark.parametrize(
    "text",
    [
        "tools:\n  t:\n    side_effect: read\n    schema: {type: objekt}\n",
        "tools:\n  t:\n    side_effect: read\n    schema: {minimum: '1'}\n",
        "tools:\n  t:\n    side_effect: sometimes\n    schema: {type: object}\n",
        "tools:\n  t:\n    side_effect: read\n    mask: [order_id]\n    schema: {type: object}\n",
        "tools:\n  t:\n    side_effect: read\n",
        "tools: [a, b]\n",
        "tools: {t: {\n",
    ],
)
def test_invalid_catalogues_are_refused_at_load(text: str) -> None:
    with pytest.raises(PolicyError) as info:
        _catalogue(text)
    assert info.value.code == "policy_load_failed"
    assert "b/tools.yaml" in info.value.detail


def test_missing_catalogue_file_is_refused() -> None:
    with pytest.raises(PolicyError):
        load_catalogue({}, "tools.yaml", where="b")


def test_mask_pointers_are_kept() -> None:
    catalogue = _catalogue(
        "tools:\n  t:\n    side_effect: write\n    mask: [/secret]\n    schema: {type: object}\n"
    )
    spec = catalogue.lookup("t")
    assert spec is not None and spec.mask == ("/secret",)
