"""Strict JSON parsing and RFC 8785 canonical hashing of tool arguments.

A permit is bound to ``args_hash(args)`` (DESIGN.md, invariant 3), so two requests that mean
the same JSON must hash the same and a request that could be read two ways must be refused:

* ``{"a":1,"b":2}`` and ``{"b":2,"a":1}`` are one call; ``100000`` and ``100000.0`` are one
  JSON number (RFC 8785 §3.2.2.3 serialises every number as an IEEE 754 double).
* Duplicate object keys (RFC 8259 §4 leaves their meaning undefined; I-JSON, RFC 7493 §2.3,
  forbids them), ``NaN``/``Infinity`` (not JSON at all, RFC 8259 §6), literals overflowing to
  infinity, integer literals outside ±(2**53 − 1) (RFC 7493 §2.2: not exactly representable as
  doubles, so ``9007199254740993`` would silently become ``9007199254740992``), invalid UTF-8
  (RFC 8259 §8.1) and lone surrogates (RFC 7493 §2.1; they have no UTF-8 encoding) are rejected
  with :class:`~cosigner.core.errors.InvalidJSON` (HTTP 422).

Canonical bytes come from the ``rfc8785`` package, or for values without floats and non-BMP
keys from the stdlib's C encoder, proven byte-identical (see :func:`canonicalize`).

Known asymmetry: a *float* of magnitude in [2**53, 1e21) canonicalises to a plain integer
literal (RFC 8785: ``1e20`` → ``100000000000000000000``), which :func:`parse_json` refuses as an
unsafe integer. Hashing such a value works; feeding canonical bytes back as a request body does
not. Large identifiers belong in strings.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, NoReturn

import rfc8785

from cosigner.core import fastjson
from cosigner.core import pointer as json_pointer
from cosigner.core.errors import InvalidJSON

__all__ = [
    "MAX_SAFE_INTEGER",
    "args_hash",
    "canonicalize",
    "canonicalize_member",
    "check_hashable",
    "hash_bytes",
    "parse_json",
]

MAX_SAFE_INTEGER = 2**53 - 1
"""Largest integer exactly representable as an IEEE 754 double (I-JSON, RFC 7493 §2.2)."""

_MAX_SAFE_DIGITS = len(str(MAX_SAFE_INTEGER))  # 16; longer literals are unsafe without int()
_SURROGATE = re.compile("[\ud800-\udfff]")
# Cheap prefilter: a lone surrogate can only come out of json.loads via a \uD800-\uDFFF escape.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SEGMENT_MAX = 64
_FAST_ENCODE = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False
).encode


def _segment(key: str) -> str:
    """One JSON pointer (RFC 6901) segment, safe to show: escaped, no surrogates, truncated."""
    seg = json_pointer.escape(key)
    if not seg.isascii():
        seg = seg.encode("utf-8", "backslashreplace").decode("utf-8")
    return seg if len(seg) <= _SEGMENT_MAX else seg[:_SEGMENT_MAX] + "…"


# --------------------------------------------------------------------------- json.loads hooks


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise InvalidJSON(
                    f"duplicate object key {_segment(key)!r}",
                    code="duplicate_key",
                    key=_segment(key),
                )
            seen.add(key)
    return obj


def _constant(name: str) -> NoReturn:
    # Called for the non-standard literals NaN, Infinity and -Infinity.
    raise InvalidJSON(f"{name} is not a JSON number", code="non_finite_number")


def _float(literal: str) -> float:
    value = float(literal)
    if value in (math.inf, -math.inf):
        raise InvalidJSON("number literal overflows to infinity", code="non_finite_number")
    return value


def _int(literal: str) -> int:
    # Length check first: no int() on a huge literal (and no int_max_str_digits error).
    if len(literal) - (literal[0] == "-") <= _MAX_SAFE_DIGITS:
        value = int(literal)
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return value
    raise InvalidJSON(
        "integer literal outside ±(2**53 - 1); send large identifiers as strings",
        code="unsafe_integer",
    )


# --------------------------------------------------------------------------------- public API


def parse_json(body: bytes | str) -> Any:
    """Strictly parse a request body into plain Python JSON values.

    ``bytes`` go through orjson first (:func:`cosigner.core.fastjson.loads`), taken only
    when one walk over the values proves the stdlib parser below would return the same;
    otherwise (and for ``str``) the stdlib parser decides: what is accepted, the value and
    every error are the stdlib parser's.

    The stdlib parser: one pass of ``json.loads`` with ``object_pairs_hook``, ``parse_constant``,
    ``parse_int`` and ``parse_float`` hooks; the result is ``dict``/``list``/``str``/``int``/
    ``float``/``bool``/``None`` with types exactly as sent (``100000.0`` stays a float, ``true``
    stays a bool), so the policy sees the JSON that was hashed (cases K25, K07).

    Args:
        body: the raw body. ``bytes`` must be UTF-8 (RFC 8259 §8.1; no UTF-16/32 sniffing, a
            BOM is refused); ``str`` must not contain lone surrogates.

    Returns:
        The parsed value (any JSON value is accepted at the top level, RFC 8259 §2).

    Raises:
        InvalidJSON: with ``code``
            ``invalid_json`` — not UTF-8, not JSON, a lone surrogate (raw or ``"\\ud800"``
            escape, in a string or a key), or nesting too deep;
            ``duplicate_key`` — a repeated key in any object, compared after unescaping
            (``"a\\u005fb"`` equals ``"a_b"``); ``extra["key"]`` names it;
            ``non_finite_number`` — ``NaN``, ``Infinity``, ``-Infinity``, or a literal such as
            ``1e400`` that overflows to infinity;
            ``unsafe_integer`` — an integer literal outside ±(2**53 − 1).
            Details never contain values, only key names / JSON pointers.
        TypeError: ``body`` is neither ``bytes`` nor ``str`` (a programming error).
    """
    if type(body) is bytes:
        proven, value = fastjson.loads(body)
        if proven:
            return value
    return _parse_stdlib(body)


def _parse_stdlib(body: bytes | str) -> Any:
    """:func:`parse_json` with the stdlib parser only (the reference the fast path is
    proven and tested against)."""
    if isinstance(body, bytes | bytearray):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidJSON(
                f"body is not valid UTF-8 (byte offset {exc.start})", code="invalid_json"
            ) from None
    elif isinstance(body, str):
        text = body
        if not text.isascii() and _SURROGATE.search(text):
            raise InvalidJSON("body contains a lone surrogate code point", code="invalid_json")
    else:
        raise TypeError(f"parse_json expects bytes or str, not {type(body).__name__}")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object_pairs,
            parse_constant=_constant,
            parse_int=_int,
            parse_float=_float,
        )
    except json.JSONDecodeError as exc:
        raise InvalidJSON(
            f"invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            code="invalid_json",
        ) from None
    except RecursionError:
        raise InvalidJSON("JSON is nested too deeply", code="invalid_json") from None
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        check_hashable(value)  # rare slow path: find the lone surrogate and its pointer
    return value


class _Reject(Exception):
    """Internal: carries code/message up the recursion; the path is collected on unwind."""

    def __init__(self, code: str, what: str) -> None:
        super().__init__(what)
        self.code = code
        self.what = what
        self.path: list[str] = []


def _check(value: Any) -> bool:
    """Validate ``value``; return True when it holds no float and no non-BMP object key.

    For such values the stdlib encoder's output is byte-identical to RFC 8785 (see
    :func:`canonicalize`), so the return value selects the fast path.
    """
    t = type(value)
    if t is str:
        if not value.isascii() and _SURROGATE.search(value):
            raise _Reject("invalid_json", "lone surrogate in string")
        return True
    if t is int:
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise _Reject("unsafe_integer", "integer outside ±(2**53 - 1)")
        return True
    if t is dict:
        simple = True
        for key, item in value.items():
            try:
                if type(key) is not str:
                    raise _Reject("invalid_json", f"object key of type {type(key).__name__}")
                if not key.isascii():
                    if _SURROGATE.search(key):
                        raise _Reject("invalid_json", "lone surrogate in object key")
                    if max(key) > "\uffff":
                        simple = False  # UTF-16 order differs from code point order
                if not _check(item):
                    simple = False
            except _Reject as exc:
                exc.path.append(_segment(key) if type(key) is str else "<non-string key>")
                raise
        return simple
    if t is list:
        simple = True
        for index, item in enumerate(value):
            try:
                if not _check(item):
                    simple = False
            except _Reject as exc:
                exc.path.append(str(index))
                raise
        return simple
    if t is float:
        if not math.isfinite(value):
            raise _Reject("non_finite_number", "NaN or infinite number")
        return False
    if t is not bool and value is not None:
        raise _Reject("invalid_json", f"value of type {t.__name__} is not JSON")
    return True


def check_hashable(value: Any) -> None:
    """Check that an already-parsed value has exactly one RFC 8785 canonical form.

    Accepted: exactly ``dict`` (``str`` keys), ``list``, ``str``, ``int``, ``float``, ``bool``,
    ``None`` — no subclasses, tuples, enums or other types. ``bool`` is its own JSON type, not an
    integer. Floats must be finite; ints within ±(2**53 − 1) (RFC 7493 §2.2); strings and keys
    must have no lone surrogates (RFC 7493 §2.1).

    Raises:
        InvalidJSON: ``non_finite_number``, ``unsafe_integer``, or ``invalid_json`` (bad type,
            non-string key, lone surrogate, nesting too deep). The detail names the JSON pointer
            (RFC 6901) of the offending place, also given as ``extra["pointer"]``; never values.
    """
    _checked(value)


def _checked(value: Any) -> bool:
    try:
        return _check(value)
    except _Reject as exc:
        pointer = "".join("/" + seg for seg in reversed(exc.path))
        where = f"at {pointer!r}" if pointer else "at the top level"
        raise InvalidJSON(f"{exc.what} {where}", code=exc.code, pointer=pointer) from None
    except RecursionError:
        raise InvalidJSON("value is nested too deeply", code="invalid_json") from None


def canonicalize(value: Any) -> bytes:
    """RFC 8785 (JCS) canonical UTF-8 bytes of ``value``.

    Objects are sorted by the UTF-16 code units of their keys, numbers use the ECMAScript
    shortest round-trip form (``1e-7``, ``1e+21``, ``-0.0`` → ``0``, ``100000.0`` → ``100000``),
    strings are raw UTF-8 with minimal escaping; no whitespace.

    Values holding a float or a non-BMP object key go through the ``rfc8785`` package. All
    others (the common case: strings, safe integers, booleans, null) use orjson with sorted
    keys (:func:`cosigner.core.fastjson.dumps_sorted`), or beyond its nesting limit the
    stdlib's C encoder; either output is then byte-identical to RFC 8785: integers print the same,
    string escaping is the same minimal set (``\\b \\f \\n \\r \\t \\" \\\\``
    and ``\\u00xx`` lowercase for other controls), and for BMP-only keys code point order is
    UTF-16 order. A hypothesis test in tests/test_canonical.py proves both paths agree.
    An object or array is first tried by :func:`cosigner.core.fastjson.canonical`, which
    proves the same bytes mostly inside orjson (tests/core/test_fastjson.py).

    Raises:
        InvalidJSON: as :func:`check_hashable` (run first); any ``rfc8785`` error is mapped to
            ``InvalidJSON`` too, so callers only ever see the domain error.
    """
    fast = fastjson.canonical(value)
    if fast is not None:
        return fast
    if _checked(value):
        fast = fastjson.dumps_sorted(value)
        if fast is not None:
            return fast
        try:
            return _FAST_ENCODE(value).encode("utf-8")
        except RecursionError:
            raise InvalidJSON("value is nested too deeply", code="invalid_json") from None
    try:
        return rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:
        raise InvalidJSON("integer outside ±(2**53 - 1)", code="unsafe_integer") from None
    except rfc8785.FloatDomainError:
        raise InvalidJSON("NaN or infinite number", code="non_finite_number") from None
    except rfc8785.CanonicalizationError as exc:
        raise InvalidJSON(f"cannot canonicalize: {exc}", code="invalid_json") from None
    except RecursionError:
        raise InvalidJSON("value is nested too deeply", code="invalid_json") from None


def canonicalize_member(whole: Any, key: str) -> tuple[bytes, bytes] | None:
    """``(canonicalize(whole[key]), canonicalize(whole))`` from one proof over ``whole``
    (:func:`cosigner.core.fastjson.canonical_member`), or ``None`` when it does not hold:
    the caller then canonicalises each itself and the reference path words any error."""
    return fastjson.canonical_member(whole, key)


def hash_bytes(data: bytes) -> str:
    """``"sha256:" + lowercase hex SHA-256`` of ``data`` (the format of every Cosigner digest)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def args_hash(args: Any) -> str:
    """The binding hash of tool arguments: ``hash_bytes(canonicalize(args))``.

    Any JSON value hashes; requiring ``args`` to be an object (case K03) is the caller's job.

    Raises:
        InvalidJSON: as :func:`canonicalize`.
    """
    return hash_bytes(canonicalize(args))
