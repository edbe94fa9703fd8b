"""Display hints of a tool catalogue: how the approver pages show an argument.

A property of a tool's JSON Schema may carry the keyword ``x-cosigner-display`` (JSON
Schema ignores unknown keywords, so validation is unchanged)::

    amount_minor:
      type: integer
      x-cosigner-display: {format: money, currency_field: /currency}

Formats:

``money``
    The value is an amount in **minor units** of a currency (ISO 4217: cents for USD and
    EUR, yen for JPY, fils for KWD), an integer. Exactly one of ``currency_field`` (an RFC
    6901 JSON pointer into the arguments, from their root, whose value is the ISO 4217
    code, e.g. ``/currency``) or ``currency`` (a fixed ISO 4217 code, e.g. ``EUR``). The
    pages format it by the currency's minor-unit exponent and the page's locale
    (``135000`` + ``EUR`` → ``€1,350.00`` in ``en_US``); the canonical arguments the hash
    covers are shown unchanged next to it. A currency code the arguments carry that is not
    ISO 4217 is shown as the raw number, never guessed.

Optional for every format: ``label``, the text shown instead of the argument's name.

Hints are validated when the bundle loads (:func:`hints_of`): an unknown format or key, a
money field whose schema is not ``type: integer``, a pointer that is not a pointer or names
no property of the schema, an unknown currency code, or a hint outside a chain of
``properties`` (where no single pointer names the value) refuse the bundle
(``policy_load_failed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KEYWORD = "x-cosigner-display"
FORMATS = frozenset({"money"})
_KEYS = {"money": frozenset({"format", "currency_field", "currency", "label"})}


@dataclass(frozen=True)
class DisplayHint:
    """How one argument (``pointer``, RFC 6901 from the arguments' root) is shown."""

    pointer: str
    format: str
    currency_field: str | None = None
    currency: str | None = None
    label: str | None = None

    def as_dict(self) -> dict[str, str]:
        return {k: v for k, v in (("format", self.format), ("currency_field",
                self.currency_field), ("currency", self.currency), ("label", self.label))
                if v is not None}


class HintError(ValueError):
    """A hint is malformed; the message names the property's pointer."""


def is_currency(code: Any) -> bool:
    """``code`` is an ISO 4217 alphabetic code babel (CLDR) knows, e.g. ``"EUR"``."""
    if not isinstance(code, str) or len(code) != 3 or not code.isalpha() or not code.isupper():
        return False
    # babel (CLDR data, ~0.6 MB resident) is imported by the first fixed currency checked,
    # not with the catalogue (issue 20, idle memory).
    from babel.numbers import get_currency_name

    return bool(get_currency_name(code, locale="en") != code)


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _property_pointers(schema: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every property reachable through ``properties`` chains: pointer → its schema."""
    out: dict[str, Any] = {}
    props = schema.get("properties")
    if isinstance(props, Mapping):
        for name, sub in props.items():
            pointer = f"{prefix}/{_escape(str(name))}"
            if isinstance(sub, Mapping):
                out[pointer] = sub
                out.update(_property_pointers(sub, pointer))
    return out


def _stray(node: Any, allowed: set[int], path: str = "") -> str | None:
    """Where a hint sits outside a ``properties`` chain (``None``: nowhere)."""
    if isinstance(node, Mapping):
        if KEYWORD in node and id(node) not in allowed:
            return path or "/"
        for key, value in node.items():
            found = _stray(value, allowed, f"{path}/{_escape(str(key))}")
            if found:
                return found
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found = _stray(value, allowed, f"{path}/{index}")
            if found:
                return found
    return None


def _parse(pointer: str, raw: Any, props: dict[str, Any]) -> DisplayHint:
    where = f"property {pointer}: {KEYWORD}"
    if not isinstance(raw, Mapping) or raw.get("format") not in FORMATS:
        raise HintError(f"{where} must be a mapping with format one of {sorted(FORMATS)}")
    fmt = str(raw["format"])
    unknown = set(raw) - _KEYS[fmt]
    if unknown:
        raise HintError(f"{where} has unknown keys {sorted(unknown)}")
    label = raw.get("label")
    if label is not None and (not isinstance(label, str) or not label.strip()
                              or len(label) > 80):
        raise HintError(f"{where}: label must be a non-empty string of at most 80 characters")
    if props[pointer].get("type") != "integer":
        raise HintError(f"{where}: a money amount is in minor units; the property's schema "
                        "must say type: integer")
    field, fixed = raw.get("currency_field"), raw.get("currency")
    if (field is None) == (fixed is None):
        raise HintError(f"{where} needs exactly one of currency_field (a JSON pointer) "
                        "or currency (an ISO 4217 code)")
    if fixed is not None and not is_currency(fixed):
        raise HintError(f"{where}: currency {fixed!r} is not an ISO 4217 code")
    if field is not None:
        if not isinstance(field, str) or not field.startswith("/"):
            raise HintError(f"{where}: currency_field must be a JSON pointer such as "
                            "'/currency'")
        if field not in props:
            raise HintError(f"{where}: currency_field {field} names no property of the schema")
    return DisplayHint(pointer=pointer, format=fmt, currency_field=field, currency=fixed,
                       label=label)


def hints_of(schema: Mapping[str, Any]) -> dict[str, DisplayHint]:
    """The display hints of a tool's argument schema: pointer → :class:`DisplayHint`.

    Raises:
        HintError: a hint is malformed or misplaced (the caller names the bundle and tool).
    """
    props = _property_pointers(schema)
    hinted = {pointer: sub for pointer, sub in props.items() if KEYWORD in sub}
    stray = _stray(schema, {id(sub) for sub in hinted.values()})
    if stray is not None:
        raise HintError(f"{KEYWORD} at {stray} is not on a property reachable through "
                        "'properties' (no single JSON pointer names that value)")
    return {pointer: _parse(pointer, sub[KEYWORD], props) for pointer, sub in hinted.items()}
