"""Money on the approver pages: minor units formatted by ISO 4217 exponent and locale, and
the text parses back to exactly the minor units the arguments (and the hash) carry."""

from __future__ import annotations

import pytest

from cosigner.audit.masking import MASK
from cosigner.policy.display import DisplayHint
from cosigner.web import amounts, views

EUR_FIELD = DisplayHint(pointer="/amount_minor", format="money", currency_field="/currency",
                        label="Amount")


@pytest.mark.parametrize(("minor", "currency", "locale", "shown"), [
    (135000, "EUR", "en_US", "€1,350.00"),
    (135000, "JPY", "en_US", "¥135,000"),  # exponent 0: no decimals
    (1234567, "KWD", "en_US", "KWD1,234.567"),  # exponent 3
    (135000, "EUR", "de_DE", "1.350,00\xa0€"),
    (5, "USD", "en_US", "$0.05"),
    (150000, "GBP", "en_GB", "£1,500.00"),
])
def test_minor_units_are_shown_in_major_units_of_the_currency(
        minor: int, currency: str, locale: str, shown: str) -> None:
    assert amounts.format_money(minor, currency, locale) == shown
    assert amounts.minor_units(shown, currency, locale) == minor


@pytest.mark.parametrize("locale", ["en_US", "de_DE", "fr_FR", "de_CH", "hi_IN", "sv_SE",
                                    "ar_EG", "ja_JP"])
@pytest.mark.parametrize("currency", ["EUR", "USD", "JPY", "KWD", "CHF", "INR"])
def test_what_is_shown_parses_back_to_the_same_minor_units(locale: str, currency: str) -> None:
    for minor in (0, 1, 7, 99, 100, 101, 135000, 9_007_199_254_740_991, -4200):
        text = amounts.format_money(minor, currency, locale)
        assert amounts.minor_units(text, currency, locale) == minor, (text, minor)


def test_the_summary_formats_the_hinted_amount_and_does_not_repeat_its_currency() -> None:
    args = {"order_id": "ord_1", "amount_minor": 135000, "currency": "EUR",
            "reason_code": "goodwill"}
    fields = views.summary(args, {"/amount_minor": EUR_FIELD}, "en_US")
    assert fields[0] == {"label": "Amount", "pointer": "/amount_minor", "money": True,
                         "text": "€1,350.00", "minor": 135000, "currency": "EUR"}
    assert [f["label"] for f in fields[1:]] == ["order_id", "reason_code"]


@pytest.mark.parametrize(("args", "shown"), [
    ({"amount_minor": 135000, "currency": "XYZ"}, "135000"),  # not ISO 4217: raw value
    ({"amount_minor": 135000.5, "currency": "EUR"}, "135000.5"),  # not an integer
    ({"amount_minor": MASK, "currency": "EUR"}, MASK),  # masked stays masked
    ({"amount_minor": 135000, "currency": MASK}, "135000"),
    ({"amount_minor": True, "currency": "EUR"}, "true"),
])
def test_an_amount_that_cannot_be_formatted_is_shown_raw(args: dict[str, object],
                                                         shown: str) -> None:
    field = views.summary(args, {"/amount_minor": EUR_FIELD}, "en_US")[0]
    assert field["money"] is False and field["text"] == shown


def test_a_fixed_currency_hint_and_a_missing_amount() -> None:
    yen = DisplayHint(pointer="/fee", format="money", currency="JPY")
    assert views.summary({"fee": 500}, {"/fee": yen}, "en_US")[0]["text"] == "¥500"
    assert views.summary({"other": 1}, {"/fee": yen}, "en_US") == [
        {"label": "other", "pointer": "/other", "text": "1", "money": False}]


def test_the_locale_comes_from_accept_language_when_cldr_knows_it() -> None:
    assert amounts.negotiate("de-DE,de;q=0.9,en;q=0.8", "en_US") == "de_DE"
    assert amounts.negotiate("xx-YY, fr;q=0.5", "en_US") == "fr"
    assert amounts.negotiate("en;q=0.2, de;q=0.9", "en_US") == "de"
    assert amounts.negotiate("*, zz;q=0", "en_GB") == "en_GB"
    assert amounts.negotiate("de;q=abc, " + "x" * 5000, "en_US") == "en_US"


@pytest.mark.parametrize(("minor", "currency", "shown"), [
    # CLDR's display "digits" are 0 for these, but ISO 4217 (what "minor units" means to
    # the tool and in the README) says 3 (IQD: fils) and 2 (RSD: para, ALL: qindarka).
    (135001, "IQD", "IQD135.001"),
    (135000, "RSD", "RSD1,350.00"),
    (135000, "ALL", "ALL1,350.00"),
    (1234567, "KWD", "KWD1,234.567"),
])
def test_the_exponent_is_iso_4217_not_cldr_display_digits(minor: int, currency: str,
                                                          shown: str) -> None:
    assert amounts.money_text(minor, currency, "en_US") == shown
    assert amounts.minor_units(shown, currency, "en_US") == minor


@pytest.mark.parametrize("currency", ["XAU", "XDR", "XXX", "XTS"])
def test_a_code_without_minor_units_is_shown_raw(currency: str) -> None:
    # ISO 4217 gives these no minor unit: any exponent would be a guess.
    assert amounts.money_text(135000, currency, "en_US") is None
    field = views.summary({"amount_minor": 135000, "currency": currency},
                          {"/amount_minor": EUR_FIELD}, "en_US")[0]
    assert field["money"] is False and field["text"] == "135000"
