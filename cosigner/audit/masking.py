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

from functools import lru_cache
from typing import Any

from cosigner.core import pointer as json_pointer

__all__ = ["ALWAYS_MASKED", "MASK", "is_always_masked", "mask_value", "mask_with_paths"]

MASK = "•••"
"""What a masked value becomes (a string, whatever the original type)."""

ALWAYS_MASKED = frozenset({"authorization", "password", "secret", "token", "apikey"})
_MASKED_SUFFIXES = ("_token", "_secret", "_password", "_api_key", "-token", "-secret",
                    "-password", "-api-key")


@lru_cache(maxsize=4096)  # member names repeat from call to call
def is_always_masked(key: str) -> bool:
    """True when an object member named ``key`` is masked at any depth."""
    lowered = key.lower()
    return (lowered.replace("_", "").replace("-", "") in ALWAYS_MASKED
            or lowered.endswith(_MASKED_SUFFIXES))


def _mask_pointer(doc: Any, pointer: str) -> tuple[Any, bool]:
    """``doc`` with the value at ``pointer`` replaced (copy-on-write), and whether it existed."""
    if pointer == "":
        return MASK, True
    if not pointer.startswith("/"):
        return doc, False
    head, sep, rest = pointer[1:].partition("/")
    key = json_pointer.unescape(head)
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


def _pointer(path: list[str], key: str) -> str:
    return json_pointer.join((*path, key))


def _mask_keys(doc: Any, path: list[str], found: list[str]) -> Any:
    """``doc`` with always-masked members replaced: ``doc`` itself when nothing is masked
    below it, else a copy that shares the unchanged parts. ``path``: the segments down to
    ``doc`` (unescaped), turned into a pointer only for what is masked."""
    changed: Any = None
    if isinstance(doc, dict):
        for key, value in doc.items():
            if is_always_masked(key):
                if value != MASK:
                    found.append(_pointer(path, key))
                new: Any = MASK
            elif isinstance(value, dict | list):
                path.append(key)
                new = _mask_keys(value, path, found)
                path.pop()
            else:
                continue
            if new is not value:
                if changed is None:
                    changed = dict(doc)
                changed[key] = new
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            if not isinstance(value, dict | list):
                continue
            path.append(str(index))
            new = _mask_keys(value, path, found)
            path.pop()
            if new is not value:
                if changed is None:
                    changed = list(doc)
                changed[index] = new
    return doc if changed is None else changed


def mask_with_paths(obj: Any, pointers: list[str] | tuple[str, ...] = ()
                    ) -> tuple[Any, list[str]]:
    """``obj`` masked, and the sorted JSON pointers that were masked.

    ``obj`` is never modified: the result is ``obj`` itself when nothing was masked, else
    a copy sharing the unchanged parts (treat it as read-only). Pointers that do not
    resolve are ignored (nothing to hide).
    """
    found: list[str] = []
    doc = obj
    for pointer in pointers:
        doc, hit = _mask_pointer(doc, pointer)
        if hit:
            found.append(pointer)
    doc = _mask_keys(doc, [], found)
    return doc, sorted(set(found))


def mask_value(obj: Any, pointers: list[str] | tuple[str, ...] = ()) -> Any:
    """``obj`` with ``pointers`` and always-masked keys replaced by :data:`MASK` (read-only;
    see :func:`mask_with_paths`)."""
    return mask_with_paths(obj, pointers)[0]
