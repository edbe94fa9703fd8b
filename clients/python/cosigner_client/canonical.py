"""RFC 8785 (JSON Canonicalization Scheme) and the args hash, agreeing byte for byte with
the server (``cosigner.core.canonical``), with the same strict rejections.

A permit is bound to ``sha256(canonical(args))``; the client computes that hash itself, so
it can refuse to send what the server would refuse (before any network call) and detect a
server that hashed something else. The canonical bytes come from the maintained
``rfc8785`` package (pure Python, no dependencies); this module adds the strict pre-checks
below, which run first. Shared golden vectors and a property test prove client and server
identical.

Rules (RFC 8785 §3.2):

* objects: members sorted by the UTF-16 code units of their names; no whitespace;
* strings: raw UTF-8, escaping only ``"``, ``\\`` and U+0000..U+001F (``\\b \\t \\n \\f \\r``
  short forms, else ``\\u00xx`` lowercase);
* numbers: as an IEEE 754 double in ECMAScript ``Number.prototype.toString`` form
  (``1e-7``, ``1e+21``, ``100000000000000000000``, ``-0`` → ``0``, ``100000.0`` → ``100000``).

Refused with :class:`~cosigner_client.errors.InvalidArguments` (codes as the server's):
``unsafe_integer`` (an int outside ±(2**53 − 1), RFC 7493 §2.2), ``non_finite_number``
(NaN, ±Infinity), ``invalid_json`` (a non-``str`` key, a lone surrogate, a value that is
not exactly ``dict``/``list``/``str``/``int``/``float``/``bool``/``None``, nesting too deep),
and, when parsing text, ``duplicate_key``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, NoReturn

import rfc8785

from cosigner_client.errors import InvalidArguments

__all__ = ["MAX_SAFE_INTEGER", "args_hash", "canonicalize", "check_hashable", "parse_json"]

MAX_SAFE_INTEGER = 2**53 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_SAFE_DIGITS = len(str(MAX_SAFE_INTEGER))


class _Reject(Exception):
    def __init__(self, code: str, what: str) -> None:
        super().__init__(what)
        self.code, self.what = code, what
        self.path: list[str] = []


def _segment(key: str) -> str:
    seg = key.replace("~", "~0").replace("/", "~1")
    seg = seg.encode("utf-8", "backslashreplace").decode("utf-8")
    return seg if len(seg) <= 64 else seg[:64] + "…"


def _check(value: Any) -> None:
    """Find the first fault in insertion order, exactly as the server's check does, so
    client and server name the same fault when a value has several."""
    t = type(value)
    if t is str:
        if not value.isascii() and _SURROGATE.search(value):
            raise _Reject("invalid_json", "lone surrogate in string")
    elif t is int:
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise _Reject("unsafe_integer", "integer outside ±(2**53 - 1)")
    elif t is dict:
        for key, item in value.items():
            try:
                if type(key) is not str:
                    raise _Reject("invalid_json", f"object key of type {type(key).__name__}")
                if not key.isascii() and _SURROGATE.search(key):
                    raise _Reject("invalid_json", "lone surrogate in object key")
                _check(item)
            except _Reject as exc:
                exc.path.append(_segment(key) if type(key) is str else "<non-string key>")
                raise
    elif t is list:
        for index, item in enumerate(value):
            try:
                _check(item)
            except _Reject as exc:
                exc.path.append(str(index))
                raise
    elif t is float:
        if not math.isfinite(value):
            raise _Reject("non_finite_number", "NaN or infinite number")
    elif t is not bool and value is not None:
        raise _Reject("invalid_json", f"value of type {t.__name__} is not JSON")


def canonicalize(value: Any) -> bytes:
    """RFC 8785 canonical UTF-8 bytes of ``value``.

    Raises:
        InvalidArguments: ``unsafe_integer``, ``non_finite_number`` or ``invalid_json``;
            ``pointer`` names the JSON pointer (RFC 6901) of the offending place, never
            the value.
    """
    try:
        _check(value)  # the strict pre-checks: what rfc8785 would accept but we must not
        return rfc8785.dumps(value)
    except _Reject as exc:
        pointer = "".join("/" + seg for seg in reversed(exc.path))
        where = f"at {pointer!r}" if pointer else "at the top level"
        raise InvalidArguments(f"{exc.what} {where}", code=exc.code, pointer=pointer) from None
    except rfc8785.IntegerDomainError:  # unreachable after _check; mapped all the same
        raise InvalidArguments("integer outside ±(2**53 - 1)", code="unsafe_integer") from None
    except rfc8785.FloatDomainError:
        raise InvalidArguments("NaN or infinite number", code="non_finite_number") from None
    except rfc8785.CanonicalizationError as exc:
        raise InvalidArguments(f"cannot canonicalize: {exc}", code="invalid_json") from None
    except RecursionError:
        raise InvalidArguments("value is nested too deeply", code="invalid_json") from None


def check_hashable(value: Any) -> None:
    """Raise :class:`InvalidArguments` unless ``value`` has exactly one canonical form."""
    canonicalize(value)


def args_hash(args: Any) -> str:
    """``"sha256:" + hex(SHA-256(canonicalize(args)))``, the binding hash of a permit."""
    return "sha256:" + hashlib.sha256(canonicalize(args)).hexdigest()


# ----------------------------------------------------------------------------- strict parse


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise InvalidArguments(f"duplicate object key {_segment(key)!r}",
                                       code="duplicate_key")
            seen.add(key)
    return obj


def _constant(name: str) -> NoReturn:
    raise InvalidArguments(f"{name} is not a JSON number", code="non_finite_number")


def _float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise InvalidArguments("number literal overflows to infinity", code="non_finite_number")
    return value


def _int(literal: str) -> int:
    if len(literal) - (literal[0] == "-") <= _MAX_SAFE_DIGITS:
        value = int(literal)
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return value
    raise InvalidArguments("integer literal outside ±(2**53 - 1); send large identifiers "
                           "as strings", code="unsafe_integer")


def parse_json(text: str | bytes) -> Any:
    """Parse JSON text exactly as the server does (``cosigner.core.canonical.parse_json``).

    Raises:
        InvalidArguments: ``invalid_json``, ``duplicate_key``, ``non_finite_number``,
            ``unsafe_integer``.
    """
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArguments("text is not valid UTF-8", code="invalid_json") from None
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant,
                           parse_int=_int, parse_float=_float)
    except json.JSONDecodeError as exc:
        raise InvalidArguments(f"invalid JSON: {exc.msg} (line {exc.lineno}, column "
                               f"{exc.colno})", code="invalid_json") from None
    except RecursionError:
        raise InvalidArguments("JSON is nested too deeply", code="invalid_json") from None
    check_hashable(value)  # lone surrogates (raw or escaped)
    return value
