"""One Rego evaluation through rego-cpp's C API, without regopy's per-call Python objects.

regopy 1.5.2's ``Interpreter.set_input(dict)`` walks the document with ``isinstance``
checks against ``collections.abc`` and a ``ctypes.create_string_buffer`` per string, and
``query_bundle_entrypoint`` wraps the answer in ``Output``/``Result`` objects, reading
the output's JSON twice. :func:`set_input` and :func:`query_entrypoint` make the same
C calls (``regoNewInput``, ``regoInput*``, ``regoSetInput``, ``regoFreeInput``;
``regoBundleQueryEntrypoint``, ``regoOutputOk``, ``regoOutputJSON``, ``regoFreeOutput``)
in the same order, through the ``ctypes`` functions regopy itself declares (its
``rego_shared.rego`` library, argument types included), so rego-cpp receives the same
input term and answers the same output. Measured on the reference refund input (the two
members it reads): ~33 µs → ~15 µs to build and set the input (session 7, bench/README.md).

The conversion is regopy's ``rego_input_from_value`` with a fast path for the exact JSON
types (``dict``, ``list``, ``str``, ``int``, ``float``, ``bool``, ``None``); any other
type takes the same ``isinstance`` chain, in the same order, as regopy (a ``bool`` before
``int``, ``Set`` before ``Mapping`` before ``Sequence``), so subclasses, tuples and sets
convert as before. Property-tested against regopy (tests/policy/test_rego_input.py).

Errors are regopy's: ``regopy.RegoError`` when rego-cpp refuses a step, ``ValueError``
for an unconvertible type, ``UnicodeEncodeError`` for a lone surrogate. Unlike regopy,
a string holding U+0000 and an integer outside int64 are refused (:class:`Unrepresentable`,
a ``RegoError``): regopy hands rego-cpp a string cut short at the NUL and an integer
wrapped by ``ctypes.c_int64``, so the policy would judge other data than the tool gets.
The input is always freed, also on an error (regopy leaked it on the non-Rego errors).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence, Set
from typing import Any

import regopy
from regopy import rego_shared

_lib = rego_shared.rego  # regopy's ctypes.CDLL, with argtypes/restype declared by regopy
_new_input = _lib.regoNewInput
_free_input = _lib.regoFreeInput
_set_input = _lib.regoSetInput
_int = _lib.regoInputInt
_float = _lib.regoInputFloat
_str = _lib.regoInputString
_bool = _lib.regoInputBoolean
_null = _lib.regoInputNull
_item = _lib.regoInputObjectItem
_object = _lib.regoInputObject
_array = _lib.regoInputArray
_set = _lib.regoInputSet
_query = _lib.regoBundleQueryEntrypoint
_output_ok = _lib.regoOutputOk
_free_output = _lib.regoFreeOutput


def _fail(code: int) -> None:
    raise regopy.RegoError("Unable to create input", code)


class Unrepresentable(regopy.RegoError):  # type: ignore[misc]
    """A value of the input that rego-cpp would receive as another value, refused so the
    decision is a ``policy_error`` deny rather than a judgement of other data than the
    tool receives: a string holding U+0000 (rego-cpp takes C strings and would see it cut
    short there, ``/srv/mcp/a\\0/../../etc`` read as ``/srv/mcp/a``; regopy passes it so)
    and an integer outside int64 (``ctypes.c_int64`` wraps it: 2**64 would be 0)."""


def _text(p: int, value: str) -> int:
    if "\0" in value:
        raise Unrepresentable("a string of the input holds U+0000, which the Rego engine "
                              "cannot represent")
    return int(_str(p, value.encode("utf-8")))


def _integer(p: int, value: int) -> int:
    if not -(2**63) <= value < 2**63:
        raise Unrepresentable("an integer of the input is outside int64, which the Rego "
                              "engine cannot represent")
    return int(_int(p, value))


def _add(p: int, value: Any) -> None:
    kind = type(value)
    if kind is str:
        code = _text(p, value)
    elif kind is dict:
        code = _add_object(p, value)
    elif kind is int:
        code = _integer(p, value)
    elif kind is list:
        for item in value:
            _add(p, item)
        code = _array(p, len(value))
    elif value is True or value is False:
        code = _bool(p, value)
    elif kind is float:
        code = _float(p, value)
    elif value is None:
        code = _null(p)
    else:
        _add_other(p, value)
        return
    if code:
        _fail(code)


def _add_object(p: int, value: Mapping[Any, Any]) -> int:
    """Each member's key and value, then the object; rego-cpp's status code of the last."""
    for key, item in value.items():
        _add(p, key)
        _add(p, item)
        if status := _item(p):
            _fail(status)
    return int(_object(p, len(value)))


def _add_other(p: int, value: Any) -> None:
    """regopy's own chain, for every type that is not exactly a JSON type."""
    if isinstance(value, int):  # bool was taken above; int subclasses (IntEnum)
        code = _integer(p, value)
    elif isinstance(value, float):
        code = _float(p, value)
    elif isinstance(value, str):
        code = _text(p, value)
    elif isinstance(value, Set):
        for item in value:
            _add(p, item)
        code = _set(p, len(value))
    elif isinstance(value, Mapping):
        code = _add_object(p, value)
    elif isinstance(value, Sequence):
        for item in value:
            _add(p, item)
        code = _array(p, len(value))
    else:
        raise ValueError("Cannot convert object of type " + str(type(value)) + " to rego input")
    if code:
        _fail(code)


def set_input(interpreter: regopy.Interpreter, value: Any) -> None:
    """``interpreter.set_input(value)`` with the conversion above (same errors)."""
    p = _new_input()
    try:
        _add(p, value)
        code = _set_input(interpreter._impl, p)
    finally:
        _free_input(p)
    if code:
        raise regopy.RegoError(rego_shared.rego_get_error(interpreter._impl), code)


def query_entrypoint(interpreter: regopy.Interpreter, bundle: regopy.Bundle,
                     plan: bytes) -> str | None:
    """rego-cpp's output text for ``plan`` (``a/b/rule`` as UTF-8), for
    :func:`parse_output`; ``None`` when the output is not ok (an evaluation error:
    conflicting outputs, a strict builtin error, an unknown plan). Raises
    ``regopy.RegoError`` when rego-cpp gives no output at all."""
    output = _query(interpreter._impl, bundle._impl, plan)
    if not output:
        raise regopy.RegoError(rego_shared.rego_get_error(interpreter._impl))
    try:
        if not _output_ok(output):
            return None
        text: str = rego_shared.rego_output_string(output)
    finally:
        _free_output(output)
    return text


def parse_output(text: str) -> list[list[Any]]:
    """The expressions of each result of :func:`query_entrypoint`'s ``text``, as regopy's
    ``Output.results[i].expressions`` would list them (``[[]]`` when undefined). Raises
    ``json.JSONDecodeError`` where regopy's ``Output`` does (rego-cpp 1.5.2 writes control
    characters of strings unescaped)."""
    if text == "undefined":
        return [[]]
    parsed = json.loads(text)
    results = parsed if isinstance(parsed, list) else [parsed]
    return [result.get("expressions", []) for result in results]
