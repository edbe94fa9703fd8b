"""Money and locale for the approver pages (CLDR data through ``babel``).

An amount is stored in **minor units** (an integer, as the tool receives it); the page shows
it in major units of its currency with the ISO 4217 exponent (2 for EUR and USD, 0 for JPY,
3 for KWD) in the page's locale: ``135000`` EUR → ``€1,350.00`` (``en_US``), ``1.350,00 €``
(``de_DE``). :func:`minor_units` parses such text back, so a test can check that what is
shown equals what is hashed.

The locale is ``COSIGNER_UI_LOCALE`` unless ``COSIGNER_UI_LOCALE_FROM_BROWSER`` is on and
the browser's ``Accept-Language`` names a locale CLDR knows (:func:`negotiate`).
"""

from __future__ import annotations

import copy
from decimal import Decimal
from functools import lru_cache

from babel import Locale, UnknownLocaleError
from babel.numbers import get_currency_precision, get_currency_symbol, parse_decimal

from cosigner.policy.display import is_currency

#: Longest ``Accept-Language`` header read (anything longer is cut, never parsed whole).
MAX_ACCEPT_LANGUAGE = 512
#: At most this many language ranges of one header are tried.
MAX_RANGES = 12


#: ISO 4217 minor units of the current codes where CLDR's ``digits`` (how many decimals
#: people usually write, what babel's precision gives) differ from the standard: CLDR
#: says 0 for all of these. The tool's "minor units" are ISO 4217's.
ISO_MINOR_UNITS = {"IQD": 3, "AFN": 2, "ALL": 2, "IRR": 2, "KPW": 2, "LAK": 2, "LBP": 2,
                   "MGA": 2, "MMK": 2, "RSD": 2, "SLL": 2, "SOS": 2, "SYP": 2, "YER": 2}
#: ISO 4217 codes with no minor unit ("N.A.": metals, funds, test, no currency).
NO_MINOR_UNIT = frozenset({"XAG", "XAU", "XBA", "XBB", "XBC", "XBD", "XDR", "XPD", "XPT",
                           "XSU", "XTS", "XUA", "XXX"})


def exponent(currency: str) -> int:
    """ISO 4217 minor-unit exponent of ``currency`` (``EUR`` → 2, ``JPY`` → 0, ``IQD`` → 3).

    Raises:
        ValueError: the code has no minor unit (:data:`NO_MINOR_UNIT`).
    """
    if currency in NO_MINOR_UNIT:
        raise ValueError(f"{currency} has no minor unit")
    return ISO_MINOR_UNITS.get(currency, int(get_currency_precision(currency)))


def format_money(minor: int, currency: str, locale: str) -> str:
    """``minor`` units of ``currency`` as locale text, every minor digit shown (exactly
    :func:`exponent` decimals, whatever CLDR's display practice).

    ``format_money(135000, "EUR", "en_US") == "€1,350.00"``;
    ``format_money(135000, "JPY", "en_US") == "¥135,000"``;
    ``format_money(135001, "IQD", "en_US") == "IQD135.001"``.
    """
    digits = exponent(currency)
    major = Decimal(minor).scaleb(-digits)
    loc = Locale.parse(locale)
    pattern = copy.copy(loc.currency_formats["standard"])
    pattern.frac_prec = (digits, digits)
    return str(pattern.apply(major, loc, currency=currency, currency_digits=False,
                             decimal_quantization=True))


def minor_units(text: str, currency: str, locale: str) -> int:
    """Parse what :func:`format_money` showed back into minor units (the inverse)."""
    loc = Locale.parse(locale)
    symbols = loc.number_symbols["latn"]
    kept = symbols["decimal"] + symbols["group"]
    bare = text.replace(get_currency_symbol(currency, locale=loc), "")
    negative = "-" in bare or symbols["minusSign"] in bare or "\u2212" in bare
    digits = "".join(ch for ch in bare if ch.isdigit() or ch in kept).strip(kept)
    value = parse_decimal(digits, locale=loc, strict=False)
    value = -value if negative else value
    scaled = value.scaleb(exponent(currency))
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{text!r} has more digits than {currency} has minor units")
    return int(scaled)


def valid_locale(name: str) -> str:
    """``name`` as a CLDR locale identifier (``en-GB`` → ``en_GB``).

    Raises:
        ValueError: CLDR does not know it.
    """
    try:
        return str(Locale.parse(name.replace("-", "_")))
    except (UnknownLocaleError, ValueError, TypeError) as exc:
        raise ValueError(f"unknown locale {name!r}") from exc


@lru_cache(maxsize=256)
def negotiate(accept_language: str, default: str) -> str:
    """The first locale of an ``Accept-Language`` header (RFC 9110 §12.5.4, by ``q``)
    that CLDR knows and that has a territory-neutral or territorial form; else ``default``."""
    ranges: list[tuple[float, int, str]] = []
    for index, part in enumerate(accept_language[:MAX_ACCEPT_LANGUAGE].split(",")[:MAX_RANGES]):
        tag, _, params = part.strip().partition(";")
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                continue
        if tag and tag != "*" and q > 0:
            ranges.append((-q, index, tag))
    for _, _, tag in sorted(ranges):
        try:
            return valid_locale(tag)
        except ValueError:
            continue
    return default


def money_text(minor: object, currency: object, locale: str) -> str | None:
    """The formatted amount, or ``None`` when the values are not an integer amount and an
    ISO 4217 code (then the page shows the raw value rather than guess)."""
    if (not isinstance(minor, int) or isinstance(minor, bool) or not is_currency(currency)
            or currency in NO_MINOR_UNIT):
        return None
    return format_money(minor, str(currency), locale)
