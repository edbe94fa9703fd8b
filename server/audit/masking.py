"""Masking before write: redact values before an event is hashed, stored or shown.

Two sources of paths (DESIGN invariant 10):

* JSON pointers (RFC 6901) named by the tool catalogue or the policy result's ``mask``;
  the pointer ``""`` masks the whole document, a missing path masks nothing.
* Keys that are always masked, at any depth, whatever the configuration: ``authorization``,
  ``password``, ``secret``, ``token``, ``api_key`` — compared case-insensitively with ``-``
  and ``_`` ignored (``API-Key``, ``apiKey``), plus names ending in ``_token``,
  ``_secret``, ``_password`` or ``_api_key`` (``access_token``, ``client_secret``).

The approval page (issue 4) and the web UI call :func:`mask_value` too, so what an approver
sees and what the log keeps are masked by one rule.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ALWAYS_MASKED", "MASK", "is_always_masked", "mask_value", "mask_with_paths"]

MASK = "•••"
"""What a masked value becomes (a string, whatever the original type)."""

ALWAYS_MASKED = frozenset({"authorization", "password", "secret", "token", "apikey"})
_MASKED_SUFFIXES = ("_token", "_secret", "_password", "_api_key", "-token", "-secret",
                    "-password", "-api-key")


def is_always_masked(key: str) -> bool:
    """True when an object member named ``key`` is masked at any depth."""
    lowered = key.lower()
    return (lowered.replace("_", "").replace("-", "") in ALWAYS_MASKED
            or lowered.endswith(_MASKED_SUFFIXES))


def _unescape(segment: str) -> str:
    return segment.replace("~1", "/").replace("~0", "~")


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _mask_pointer(doc: Any, pointer: str) -> tuple[Any, bool]:
    """``doc`` with the value at ``pointer`` replaced (copy-on-write), and whether it existed."""
    if pointer == "":
        return MASK, True
    if not pointer.startswith("/"):
        return doc, False
    head, sep, rest = pointer[1:].partition("/")
    key = _unescape(head)
    tail = "/" + rest if sep else ""
    if isinstance(doc, dict) and key in doc:
        value, hit = _mask_pointer(doc[key], tail)
        return ({**doc, key: value}, True) if hit else (doc, False)
    if isinstance(doc, list) and key.isdigit() and int(key) < len(doc) and (
            key == "0" or not key.startswith("0")):
        index = int(key)
        value, hit = _mask_pointer(doc[index], tail)
        if not hit:
            return doc, False
        copy = list(doc)
        copy[index] = value
        return copy, True
    return doc, False


def _mask_keys(doc: Any, path: str, found: list[str]) -> Any:
    if isinstance(doc, dict):
        out: dict[str, Any] = {}
        for key, value in doc.items():
            child = f"{path}/{_escape(key)}"
            if is_always_masked(key):
                if value != MASK:
                    found.append(child)
                out[key] = MASK
            else:
                out[key] = _mask_keys(value, child, found)
        return out
    if isinstance(doc, list):
        return [_mask_keys(v, f"{path}/{i}", found) for i, v in enumerate(doc)]
    return doc


def mask_with_paths(obj: Any, pointers: list[str] | tuple[str, ...] = ()
                    ) -> tuple[Any, list[str]]:
    """A masked copy of ``obj`` and the sorted JSON pointers that were masked.

    ``obj`` is never modified. Pointers that do not resolve are ignored (nothing to hide).
    """
    found: list[str] = []
    doc = obj
    for pointer in pointers:
        doc, hit = _mask_pointer(doc, pointer)
        if hit:
            found.append(pointer)
    doc = _mask_keys(doc, "", found)
    return doc, sorted(set(found))


def mask_value(obj: Any, pointers: list[str] | tuple[str, ...] = ()) -> Any:
    """A copy of ``obj`` with ``pointers`` and always-masked keys replaced by :data:`MASK`."""
    return mask_with_paths(obj, pointers)[0]
