"""Pure helpers that turn approval data into what the pages show.

The arguments block is the RFC 8785 canonical text of the (masked) arguments, re-indented
token by token: no number or string is re-serialised, so what the page shows is byte for
byte what was hashed (case K07), apart from masked values shown as ``•••``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cosigner.audit.masking import MASK
from cosigner.core import pointer as json_pointer
from cosigner.core.canonical import canonicalize
from cosigner.policy.display import DisplayHint
from cosigner.web.amounts import money_text

_AMOUNT_RE = re.compile(r"amount|total|price|cost|fee|sum|value|currency|quantity|qty",
                        re.IGNORECASE)
HIGHLIGHTS = 4


def pretty_canonical(value: Any) -> str:
    """Indented RFC 8785 text of ``value`` (2 spaces), scalars exactly as canonicalised."""
    text = canonicalize(value).decode()
    out: list[str] = []
    depth, i, n = 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':  # copy a whole string token, escapes included
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
            continue
        if ch in "{[":
            closer = "}" if ch == "{" else "]"
            if i + 1 < n and text[i + 1] == closer:
                out.append(ch + closer)
                i += 2
                continue
            depth += 1
            out.append(ch + "\n" + "  " * depth)
        elif ch in "}]":
            depth -= 1
            out.append("\n" + "  " * depth + ch)
        elif ch == ",":
            out.append(",\n" + "  " * depth)
        elif ch == ":":
            out.append(": ")
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def scalar_text(value: Any) -> str:
    """One argument value as short text (objects and arrays in canonical form)."""
    if isinstance(value, str):
        return value
    return canonicalize(value).decode()


def highlights(args: dict[str, Any], limit: int = HIGHLIGHTS) -> list[tuple[str, str]]:
    """Up to ``limit`` ``(name, value)`` pairs, amount-like names first."""
    keys = sorted(args, key=lambda k: (not _AMOUNT_RE.search(k), k))
    return [(k, scalar_text(args[k])[:120]) for k in keys[:limit]]


def money_field(args: Any, hint: DisplayHint, locale: str) -> dict[str, Any] | None:
    """A ``money`` hint applied to ``args``: ``{label, pointer, text, minor, currency}``;
    ``text`` is the formatted amount, or the raw value when it cannot be formatted (masked,
    not an integer, not an ISO 4217 code). ``None`` when the argument is absent."""
    missing = object()
    minor = json_pointer.resolve(args, hint.pointer, missing)
    if minor is missing:
        return None
    currency = (hint.currency if hint.currency is not None
                else json_pointer.resolve(args, hint.currency_field or "", None))
    label = hint.label or json_pointer.unescape(hint.pointer.rsplit("/", 1)[-1])
    formatted = None if MASK in (minor, currency) else money_text(minor, currency, locale)
    return {"label": label, "pointer": hint.pointer, "money": formatted is not None,
            "text": formatted if formatted is not None else scalar_text(minor)[:120],
            "minor": minor, "currency": currency}


def summary(args: Any, hints: Mapping[str, DisplayHint], locale: str,
            limit: int = HIGHLIGHTS) -> list[dict[str, Any]]:
    """Up to ``limit`` fields to show first: hinted money amounts (formatted, their currency
    field not repeated), then top-level arguments, amount-like names first.

    Each: ``{label, pointer, text, money: bool}`` (money ones add ``minor``, ``currency``).
    """
    if not isinstance(args, dict):
        return []
    out: list[dict[str, Any]] = []
    used: set[str] = set()
    for hint in hints.values():
        if hint.format == "money" and (field := money_field(args, hint, locale)) is not None:
            out.append(field)
            used.add(hint.pointer)
            if field["money"] and hint.currency_field:
                used.add(hint.currency_field)
    for name, text in highlights(args, limit=len(args)):
        pointer = "/" + json_pointer.escape(name)
        if pointer not in used:
            out.append({"label": name, "pointer": pointer, "text": text, "money": False})
    return out[:limit]


def seconds_left(expires_at: datetime, now: datetime) -> int:
    """Whole seconds until ``expires_at`` (0 once expired)."""
    return max(0, int((expires_at - now).total_seconds()))


def time_left(expires_at: datetime, now: datetime) -> str:
    """``"12 min left"``-style text; ``"expired"`` at or after ``expires_at`` (invariant 5)."""
    seconds = int((expires_at - now).total_seconds())
    if seconds <= 0 or now >= expires_at:
        return "expired"
    if seconds < 60:
        return f"{seconds} s left"
    if seconds < 3600:
        return f"{seconds // 60} min left"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min left"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h left"


def party(value: Any) -> str:
    """``id (type)`` of a principal/initiator object."""
    if isinstance(value, dict):
        kind = value.get("type")
        return f"{value.get('id', '?')} ({kind})" if kind else str(value.get("id", "?"))
    return str(value)


def utc_text(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC") if at else ""
