"""The engine's direct rego-cpp calls (cosigner/policy/rego_input.py) against regopy's own.

For any value, the input document rego-cpp sees after :func:`set_input` is the one it
sees after ``regopy.Interpreter.set_input`` (read back through a policy that returns
``input``), or both raise the same exception type; and :func:`query_entrypoint` with
:func:`parse_output` lists
exactly ``Output.results[i].expressions`` (undefined, errors and values alike).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import pytest
import regopy
from hypothesis import given
from hypothesis import strategies as st

from cosigner.policy.rego_engine import compile_modules
from cosigner.policy.rego_input import parse_output, query_entrypoint, set_input

ECHO = "package t\n\necho := input\n\nhalf := input.n / 2\n\nboth := input.a if input.b\n"
PLANS = ["t/echo", "t/half", "t/both"]


class Level(enum.IntEnum):
    LOW = 1


@pytest.fixture(scope="module")
def echo() -> tuple[regopy.Interpreter, regopy.Bundle]:
    return compile_modules({"t.rego": ECHO}, PLANS, where="t")


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("ok", call())
    except Exception as exc:  # the type is what must match
        return ("error", type(exc).__name__)


def seen_after(setter: Callable[[], None], it: regopy.Interpreter,
               bundle: regopy.Bundle) -> tuple[str, Any]:
    def read() -> Any:
        setter()
        return str(it.query_bundle_entrypoint(bundle, "t/echo"))
    return outcome(read)


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.integers()  # beyond int64: ctypes refuses it both ways
    | st.floats(allow_nan=False)
    | st.text()
    | st.sampled_from(["", "a\x00b", "\ud800", "é€😀", Level.LOW, 1.0, -0.0])
)


def containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (st.lists(inner, max_size=5)
            | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5), inner, max_size=5)
            | st.lists(inner, max_size=3).map(tuple)
            | st.frozensets(st.integers(-3, 3) | st.text(max_size=3), max_size=3))


values = st.recursive(scalars, containers, max_leaves=25)


@given(value=values)
def test_input_rego_sees_is_regopys(echo: tuple[regopy.Interpreter, regopy.Bundle],
                                    value: Any) -> None:
    it, bundle = echo
    ours = seen_after(lambda: set_input(it, value), it, bundle)
    theirs = seen_after(lambda: it.set_input(value), it, bundle)
    if ours == ("error", "Unrepresentable"):  # regopy passes it cut short or wrapped
        assert unrepresentable(value)
    else:
        assert ours == theirs


def unrepresentable(value: Any) -> bool:
    """A string holding U+0000 or an integer outside int64 anywhere in ``value``."""
    if isinstance(value, str):
        return "\0" in value
    if isinstance(value, int) and not isinstance(value, bool):
        return not -(2**63) <= value < 2**63
    if isinstance(value, dict):
        return any(unrepresentable(k) or unrepresentable(v) for k, v in value.items())
    if isinstance(value, list | tuple | frozenset):
        return any(map(unrepresentable, value))
    return False


def test_unconvertible_and_oversized_values_raise_regopys_errors(
        echo: tuple[regopy.Interpreter, regopy.Bundle]) -> None:
    it, bundle = echo
    for value, error in [({"a": object()}, "ValueError"), (type(None), "ValueError"),
                         ({"s": "\ud800"}, "UnicodeEncodeError"), ({b"k": 1}, None)]:
        ours = seen_after(lambda v=value: set_input(it, v), it, bundle)
        theirs = seen_after(lambda v=value: it.set_input(v), it, bundle)
        assert ours == theirs
        assert ours[1] == error or error is None  # bytes are a Sequence: an array of ints


def test_nul_strings_and_integers_beyond_int64_are_refused(
        echo: tuple[regopy.Interpreter, regopy.Bundle]) -> None:
    # regopy 1.5.2 passes a string cut short at U+0000 and an int through ctypes.c_int64,
    # which wraps silently (2**64 is 0): the policy would judge other data than the tool
    # gets. The engine refuses both (a policy_error deny).
    it, bundle = echo
    assert seen_after(lambda: it.set_input({"n": 2**64}), it, bundle) == (
        "ok", '{"expressions":[{"n":0}]}')
    assert seen_after(lambda: it.set_input({"s": "a\0b"}), it, bundle) == (
        "ok", '{"expressions":[{"s":"a"}]}')
    for value in [2**64, 2**63, -(2**63) - 1, "a\0b", "\0", {"k\0": 1}, [["\0"]]]:
        assert seen_after(lambda v=value: set_input(it, {"n": v}), it, bundle) == (
            "error", "Unrepresentable"), value
    for value in [2**63 - 1, -(2**63)]:
        assert seen_after(lambda v=value: set_input(it, {"n": v}), it, bundle) == \
            seen_after(lambda v=value: it.set_input({"n": v}), it, bundle)


@given(doc=st.fixed_dictionaries(
    {}, optional={"n": st.integers(-10, 10) | st.text(max_size=2) | st.none(),
                  "a": st.integers() | st.text(max_size=3),
                  "b": st.booleans() | st.integers(0, 1)}))
def test_query_lists_regopys_expressions(echo: tuple[regopy.Interpreter, regopy.Bundle],
                                         doc: dict[str, Any]) -> None:
    it, bundle = echo
    it.strict_built_in_errors = True
    it.set_input(doc)
    for plan in [*PLANS, "t/nothing"]:  # an unknown plan: an output that is not ok
        def theirs(plan: str = plan) -> list[list[Any]] | None:
            output = it.query_bundle_entrypoint(bundle, plan)
            return [r.expressions for r in output.results] if output.ok() else None
        # rego-cpp writes control characters unescaped: both fail on json.loads then
        def ours(plan: str = plan) -> list[list[Any]] | None:
            text = query_entrypoint(it, bundle, plan.encode())
            return None if text is None else parse_output(text)
        assert outcome(ours) == outcome(theirs)
