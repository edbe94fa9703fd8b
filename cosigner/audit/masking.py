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

import re
from functools import lru_cache
from typing import Any

import orjson

from cosigner.core import pointer as json_pointer

__all__ = ["ALWAYS_MASKED", "MASK", "is_always_masked", "mask_pointers", "mask_value",
           "mask_with_paths", "none_masked"]

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


#: orjson options of :func:`_no_masked_keys`: a subclass of ``str``/``int``/``dict``/``list``
#: (whose keys or items a subclass may present differently), a dataclass or a datetime is
#: refused (the walk decides).
_PROOF_OPTIONS = (orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS
                  | orjson.OPT_PASSTHROUGH_DATETIME)
#: Characters outside ASCII whose ``str.lower()`` holds an ASCII letter: ``İ`` (→ ``i̇``)
#: and the Kelvin sign (→ ``k``); tests/audit/test_masking.py checks no other exists in
#: the running interpreter's Unicode database.
_LOWERS_TO_ASCII = re.compile("[\u0130\u212a]")
#: What every always-masked key contains once lowercased with ``_`` and ``-`` removed
#: (written out in :func:`_no_masked_keys`).
_MASKED_WORDS = (b"token", b"secret", b"password", b"apikey", b"authorization")


def _no_masked_keys(doc: Any) -> bool:
    """True when no object member anywhere in ``doc`` is :func:`is_always_masked` — proven
    from ``doc``'s JSON text, without a walk in Python; False when not proven (the walk
    decides).

    Proof: without a backslash in orjson's output, every key is written there verbatim
    (orjson escapes only ``"``, ``\\`` and control characters). An always-masked key,
    lowercased and stripped of ``_``/``-``, equals or (for the suffixes) ends with one of
    :data:`_MASKED_WORDS`; as long as no character lowercases into ASCII letters
    (:data:`_LOWERS_TO_ASCII`), the ASCII letters of a lowercased key are its own ASCII
    letters, contiguous in the text, so the text lowercased (ASCII) and stripped of
    ``_``/``-`` contains that word. It contains none of them, so no key is masked. Extra
    text (values, keys of things the walk does not enter) can only refuse the proof."""
    try:
        text = orjson.dumps(doc, option=_PROOF_OPTIONS)
    except (orjson.JSONEncodeError, TypeError):
        return False
    # Byte searches written as ``0x5C in`` / ``find``: ``b"..." in text`` first tries the
    # needle as an integer, raising and clearing a TypeError each time (~1.8k instructions).
    if 0x5C in text:  # a backslash
        return False
    if not text.isascii() and _LOWERS_TO_ASCII.search(text.decode()):
        return False
    folded = text.lower().translate(None, b"_-")
    return (folded.find(b"token") < 0 and folded.find(b"secret") < 0
            and folded.find(b"password") < 0 and folded.find(b"apikey") < 0
            and folded.find(b"authorization") < 0)


#: Member names found not :func:`is_always_masked` (names repeat from event to event).
_CLEAR_NAMES: set[str] = set()
_CLEAR_NAMES_MAX = 4096


def none_masked(names: set[str]) -> bool:
    """True when no name in ``names`` (member names, exactly ``str``) is
    :func:`is_always_masked`."""
    unknown = names - _CLEAR_NAMES
    for name in unknown:
        if is_always_masked(name):
            return False
    if unknown and len(_CLEAR_NAMES) + len(unknown) <= _CLEAR_NAMES_MAX:
        _CLEAR_NAMES.update(unknown)
    return True


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
    doc, found = mask_pointers(obj, pointers)
    if not _no_masked_keys(doc):
        doc = _mask_keys(doc, [], found)
    return doc, sorted(set(found))


def mask_pointers(obj: Any, pointers: list[str] | tuple[str, ...]) -> tuple[Any, list[str]]:
    """``obj`` with the values at ``pointers`` masked (copy-on-write, as
    :func:`mask_with_paths`), and the pointers that resolved, in order; always-masked keys
    are left as they are."""
    found: list[str] = []
    doc = obj
    for pointer in pointers:
        doc, hit = _mask_pointer(doc, pointer)
        if hit:
            found.append(pointer)
    return doc, found


def mask_value(obj: Any, pointers: list[str] | tuple[str, ...] = ()) -> Any:
    """``obj`` with ``pointers`` and always-masked keys replaced by :data:`MASK` (read-only;
    see :func:`mask_with_paths`)."""
    # mask_with_paths(obj, pointers)[0], without sorting the paths it would report.
    doc, found = mask_pointers(obj, pointers) if pointers else (obj, [])
    return doc if _no_masked_keys(doc) else _mask_keys(doc, [], found)
