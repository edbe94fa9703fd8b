"""orjson fast paths of :mod:`cosigner.core.canonical`, taken only where provably identical.

:func:`loads` is the strict parser's fast path: orjson parses, then one walk over the
values proves that today's stdlib parser (``canonical._parse_stdlib``) would have
returned the same value; when the proof fails, the caller falls back to that parser,
which then decides (and words the error). So accept/reject and the error code are the
stdlib parser's by construction. What orjson alone would let through, and how each is
ruled out:

* **Duplicate keys** (orjson keeps the last one). Proof by counting: the body's ``:``
  bytes are the key/value pairs written plus the colons inside strings. Without any
  ``\\u`` escape in the body (else: fall back), every colon of a parsed string is a colon
  written inside a string, so ``body.count(b":") == pairs parsed + colons in parsed
  strings`` holds exactly when no pair was dropped, i.e. no key repeats. Or, cheaper
  when strings hold colons (a ``sha256:`` digest in a token's claims): orjson's compact
  output of the parsed value *is* the body, byte for byte; that text lists each object's
  keys once (they are a dict's keys), so no key of the body repeats. That equality,
  checked first with ``OPT_STRICT_INTEGER``, proves the numbers too, without the walk
  below: orjson prints a float with a ``.`` or an exponent, so no integer literal of the
  body was read as a float; printing refuses an integer outside ±(2**53 − 1); and orjson
  reads no literal as a non-finite float. Every float then came from a float literal,
  which the stdlib parser reads to the same (correctly rounded) value.
* **Unsafe integers**: an integer outside ±(2**53 − 1) parses as a Python int (below
  2**64) or, beyond, as a *float*; so any int outside the range and any float of
  magnitude ≥ 2**53 falls back.
* **Non-finite numbers**: orjson refuses ``NaN``/``Infinity`` and literals overflowing to
  infinity (fall back); the walk checks finiteness anyway.
* **Invalid UTF-8, lone surrogates, a BOM**: orjson refuses them (fall back: the stdlib
  parser decides).
* **Deep nesting**: the stdlib parser refuses what nests deeper than the interpreter's
  recursion limit allows *where it is called*; a body with more than
  :data:`MAX_BRACKETS` ``[``/``{`` bytes falls back, so the fast path never meets it.

:func:`dumps_sorted` is RFC 8785 for values :func:`canonical._check` found "simple"
(strings, safe integers, booleans, null, lists and objects with BMP-only keys): orjson
prints integers as RFC 8785 does, escapes exactly ``\\b \\t \\n \\f \\r \\" \\\\`` and
other controls as lowercase ``\\u00xx`` (as ECMAScript ``JSON.stringify``), writes every
other character as raw UTF-8, and sorts keys by code point, which for BMP-only keys is
UTF-16 code-unit order. tests/core/test_fastjson.py checks both byte for byte against the
``rfc8785`` package and today's parser with hypothesis.
"""

from __future__ import annotations

import math
import re
from typing import Any, NoReturn

import orjson

_MAX_SAFE = 2**53 - 1
_LIMIT = 2.0**53
_SORTED = orjson.OPT_SORT_KEYS
#: orjson refuses, with these options and :func:`_refuse` as ``default``: non-``str``
#: keys, lone surrogates, integers outside ±(2**53 − 1), nesting beyond 255, and every
#: type it does not print itself, subclasses of ``str``/``int``/``dict``/``list``,
#: dataclasses and datetimes included.
_PROVING = (orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER | orjson.OPT_PASSTHROUGH_SUBCLASS
            | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME)
#: :data:`_PROVING` with keys in their order (:func:`exact_key`).
_PROVING_ORDERED = _PROVING & ~orjson.OPT_SORT_KEYS
#: A byte that starts a 4-byte UTF-8 sequence: a character beyond the BMP.
_BEYOND_BMP = re.compile(b"[\xf0-\xff]")
#: Bodies with more ``[`` and ``{`` bytes than this are parsed by the stdlib parser.
MAX_BRACKETS = 200


class _Unproven(Exception):
    """The walk cannot prove equality with the stdlib parser: fall back."""


def _walk(value: Any) -> int:
    """Key/value pairs in ``value``; raises :class:`_Unproven` on an unsafe number."""
    t = type(value)
    if t is dict:
        pairs = len(value)
        for item in value.values():
            if type(item) in (dict, list, int, float):
                pairs += _walk(item)
        return pairs
    if t is list:
        pairs = 0
        for item in value:
            if type(item) in (dict, list, int, float):
                pairs += _walk(item)
        return pairs
    if t is int:
        if -_MAX_SAFE <= value <= _MAX_SAFE:
            return 0
        raise _Unproven
    if t is float and math.isfinite(value) and -_LIMIT < value < _LIMIT:
        return 0
    raise _Unproven


def _colons(value: Any) -> int:
    """Colons in every string and key of ``value``."""
    t = type(value)
    if t is str:
        colons: int = value.count(":")
        return colons
    if t is dict:
        return sum(k.count(":") + _colons(v) for k, v in value.items())
    if t is list:
        return sum(_colons(v) for v in value)
    return 0


def loads(body: bytes) -> tuple[bool, Any]:
    """``(True, value)`` when the stdlib strict parser would return ``value`` for ``body``
    too; ``(False, None)`` when that is not proven (the caller parses with it)."""
    if b"\\u" in body or body.count(b"{") + body.count(b"[") > MAX_BRACKETS:
        return False, None
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False, None
    t = type(value)
    if t is str or t is bool or value is None:
        return True, value
    try:  # a compact body (as clients write it) is proven without a walk
        if orjson.dumps(value, option=orjson.OPT_STRICT_INTEGER) == body:
            return True, value
    except orjson.JSONEncodeError:  # an integer outside ±(2**53 − 1)
        return False, None
    try:
        pairs = _walk(value)
    except (_Unproven, RecursionError):
        return False, None
    colons = body.count(b":")
    if colons == pairs or colons == pairs + _colons(value):
        return True, value
    return False, None


def canonical(value: Any) -> bytes | None:
    """RFC 8785 bytes of an object or array, when proven without walking it in Python
    value by value; ``None`` otherwise (the caller's reference path decides).

    The proof: orjson prints ``value`` with :data:`_PROVING` (so every key is exactly
    ``str``, no string has a lone surrogate, every integer is safe, nothing nests too
    deep, and every value is of a type orjson prints itself); the output holds no
    character beyond the BMP (so code point order of the keys is UTF-16 order); and
    :func:`_exact` finds every value to be exactly ``dict``, ``list``, ``str``, ``int``,
    ``bool`` or ``None`` (ruling out what orjson prints but RFC 8785 prints otherwise or
    ``canonical._check`` refuses: floats, tuples, enums, UUIDs, fragments). Then
    ``canonical._check`` returns True and :func:`dumps_sorted` gives these same bytes.
    """
    out = _proven(value, _PROVING)
    if out is not None and not out.isascii() and _BEYOND_BMP.search(out):
        return None
    return out


def exact_key(value: Any) -> bytes | None:
    """Compact JSON bytes of an object or array, keys in their order, that name it among
    values of exactly ``dict``, ``list``, ``str``, ``int``, ``bool`` or ``None`` (so two
    values with equal bytes are equal, with the same key order); ``None`` when any value
    under it is of another type (a float, a subclass, a tuple), a key is not exactly
    ``str``, a string holds a lone surrogate, an integer is outside ±(2**53 − 1) or it
    nests beyond orjson's limit. A cache key, not RFC 8785 (keys are not sorted)."""
    return _proven(value, _PROVING_ORDERED)


def _proven(value: Any, option: int) -> bytes | None:
    """orjson's bytes of an object or array with ``option`` (:data:`_PROVING` or
    :data:`_PROVING_ORDERED`) when it prints it and :func:`_exact` holds, else ``None``."""
    if type(value) is not dict and type(value) is not list:
        return None
    try:
        out = orjson.dumps(value, default=_refuse, option=option)
    except orjson.JSONEncodeError:
        return None
    try:
        return out if _exact(value) else None
    except RecursionError:
        return None


def canonical_member(value: Any, key: str) -> tuple[bytes, bytes] | None:
    """``(RFC 8785 bytes of value[key], RFC 8785 bytes of value)`` from the one proof of
    :func:`canonical` over ``value`` (a member of a proven object is proven too), or
    ``None`` when that proof does not hold or ``value`` is not an object holding ``key``."""
    whole = canonical(value)
    if whole is None or type(value) is not dict or key not in value:
        return None
    return orjson.dumps(value[key], option=_SORTED), whole


def _refuse(value: Any) -> NoReturn:
    raise TypeError


def _exact(value: Any) -> bool:
    """Every value under ``value`` (keys aside) is exactly a dict, list, str, int, bool
    or None."""
    for item in value.values() if type(value) is dict else value:
        t = type(item)
        if t is str:
            continue
        if t is dict or t is list:
            if not _exact(item):
                return False
        elif t is not int and t is not bool and item is not None:
            return False
    return True


def dumps_sorted(value: Any) -> bytes | None:
    """RFC 8785 bytes of a value :func:`cosigner.core.canonical._check` found simple, or
    ``None`` when orjson cannot encode it (nesting beyond its limit)."""
    try:
        return orjson.dumps(value, option=_SORTED)
    except orjson.JSONEncodeError:
        return None
