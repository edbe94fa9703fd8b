"""Display hints in the tool catalogue (``x-cosigner-display``): checked when a bundle
loads, never a change to what the arguments must be."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from cosigner.core.errors import PolicyError
from cosigner.policy.catalogue import load_catalogue
from cosigner.policy.display import DisplayHint
from tests.policy.conftest import REFUNDS_PY


def _catalogue(properties: dict[str, Any], **schema: Any) -> Any:
    tools = {"tools": {"pay": {"side_effect": "financial", "schema": {
        "type": "object", "properties": properties, **schema}}}}
    return load_catalogue({"tools.yaml": yaml.safe_dump(tools).encode()}, "tools.yaml",
                          where="bundle")


def _refused(properties: dict[str, Any], **schema: Any) -> str:
    with pytest.raises(PolicyError) as info:
        _catalogue(properties, **schema)
    assert info.value.code == "policy_load_failed"
    return str(info.value.detail)


MONEY = {"format": "money", "currency_field": "/currency"}


def test_the_refund_catalogue_marks_amount_minor_as_money_of_its_currency_field() -> None:
    files = {"tools.yaml": (REFUNDS_PY / "tools.yaml").read_bytes()}
    spec = load_catalogue(files, "tools.yaml", where=str(REFUNDS_PY)).lookup("issue_refund")
    assert spec is not None
    assert dict(spec.display) == {"/amount_minor": DisplayHint(
        pointer="/amount_minor", format="money", currency_field="/currency", label="Amount")}
    spec.validate({"order_id": "ord_1", "amount_minor": 135000, "currency": "EUR",
                   "reason_code": "goodwill"})  # the hint changes nothing about validation


def test_nested_amounts_and_fixed_currencies_are_accepted() -> None:
    catalogue = _catalogue({
        "payment": {"type": "object", "properties": {
            "amount": {"type": "integer", "x-cosigner-display": {
                "format": "money", "currency_field": "/payment/currency"}},
            "currency": {"type": "string"}}},
        "fee_yen": {"type": "integer", "x-cosigner-display": {"format": "money",
                                                              "currency": "JPY"}}})
    display = catalogue.lookup("pay").display
    assert display["/payment/amount"].currency_field == "/payment/currency"
    assert display["/fee_yen"].currency == "JPY"


@pytest.mark.parametrize(("hint", "prop", "needle"), [
    ({"format": "percent"}, {"type": "integer"}, "format one of ['money']"),
    ("money", {"type": "integer"}, "must be a mapping"),
    ({**MONEY, "colour": "red"}, {"type": "integer"}, "unknown keys ['colour']"),
    (MONEY, {"type": "number"}, "must say type: integer"),
    ({"format": "money"}, {"type": "integer"}, "exactly one of currency_field"),
    ({**MONEY, "currency": "EUR"}, {"type": "integer"}, "exactly one of currency_field"),
    ({"format": "money", "currency": "EURO"}, {"type": "integer"}, "not an ISO 4217 code"),
    ({"format": "money", "currency": "ZZZ"}, {"type": "integer"}, "not an ISO 4217 code"),
    ({"format": "money", "currency_field": "currency"}, {"type": "integer"},
     "must be a JSON pointer"),
    ({"format": "money", "currency_field": "/ccy"}, {"type": "integer"},
     "names no property"),
    ({**MONEY, "label": ""}, {"type": "integer"}, "label must be"),
])
def test_a_malformed_hint_refuses_the_bundle(hint: Any, prop: dict[str, Any],
                                             needle: str) -> None:
    detail = _refused({"amount": {**prop, "x-cosigner-display": hint},
                       "currency": {"type": "string"}})
    assert needle in detail and "tool 'pay'" in detail and "/amount" in detail


def test_a_hint_where_no_single_pointer_names_the_value_refuses_the_bundle() -> None:
    detail = _refused({"lines": {"type": "array", "items": {
        "type": "integer", "x-cosigner-display": {"format": "money", "currency": "EUR"}}}})
    assert "/properties/lines/items" in detail and "not on a property" in detail
    detail = _refused({}, **{"x-cosigner-display": {"format": "money", "currency": "EUR"}})
    assert "x-cosigner-display at /" in detail
