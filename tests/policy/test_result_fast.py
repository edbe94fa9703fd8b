"""validate_result's quicker checks (session 8, issue 20) and its shared results for
plain allow/deny (session 10) and require_approval (session 11) accept, refuse and build
exactly what the plain checks did: a property test against the former code (kept below
as the reference), on policy results built from the contract's own vocabulary plus the
near misses a rule could return (tuples for lists, str subclasses, bools for ints,
unknown keys, an empty tuple for ``mask``, members that print or compare alike: ``NaN``
and ``null``, ``1``, ``1.0`` and ``true``) and lookalikes a shared result must not
answer for."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cosigner.core.errors import PolicyError
from cosigner.policy import result as result_module
from cosigner.policy.result import (
    _RESULT_KEYS,
    EFFECTS,
    PolicyResult,
    Reason,
    parse_requirement,
    validate_result,
)


def _reference_reasons(raw: Any) -> tuple[Reason, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise PolicyError("reasons must be a list")
    reasons = []
    for item in raw:
        if isinstance(item, str):
            reasons.append(Reason(item))
        elif (isinstance(item, dict) and isinstance(item.get("code"), str)
              and isinstance(item.get("message", ""), str) and set(item) <= {"code", "message"}):
            reasons.append(Reason(item["code"], item.get("message", "")))
        else:
            raise PolicyError("each reason must be a string or {code, message}")
    return tuple(reasons)


def _reference(raw: Any) -> PolicyResult:
    """validate_result as it was before session 8."""
    if not isinstance(raw, dict):
        raise PolicyError(f"policy result must be an object, got {type(raw).__name__}")
    unknown = set(raw) - _RESULT_KEYS
    if unknown:
        raise PolicyError(f"policy result has unknown keys: {sorted(unknown)}")
    effect = raw.get("effect")
    if not isinstance(effect, str) or effect not in EFFECTS:
        raise PolicyError("policy result effect must be allow, deny or require_approval")
    reasons = _reference_reasons(raw.get("reasons"))
    approval = None
    if effect == "require_approval":
        approval = parse_requirement(raw.get("approval"))
    elif raw.get("approval") is not None:
        raise PolicyError("approval is only valid with effect require_approval")
    mask = raw.get("mask", [])
    if not isinstance(mask, list) or not all(
        isinstance(p, str) and (p == "" or p.startswith("/")) for p in mask
    ):
        raise PolicyError("mask must be a list of JSON pointers")
    ttl = raw.get("permit_ttl_s")
    if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 1):
        raise PolicyError("permit_ttl_s must be a positive integer")
    return PolicyResult(effect, reasons, approval, tuple(mask), ttl)  # type: ignore[arg-type]


class Text(str):
    """A str subclass, as a rule could return."""


_words = st.sampled_from(["allow", "deny", "require_approval", "code", "message", "finance",
                          "x", "", "/args/a", "/", "a/b", "within_limit"])
_strings = _words | _words.map(Text) | st.text(max_size=4)
_scalars = _strings | st.none() | st.booleans() | st.integers(-2, 3) | st.floats(
    allow_nan=False, width=16)


def _lists(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (st.lists(inner, max_size=3) | st.lists(inner, max_size=3).map(tuple))


_reason = (_strings | st.fixed_dictionaries({"code": _scalars}, optional={
    "message": _scalars, "other": _scalars}) | st.integers())
_group = st.fixed_dictionaries({"role": st.sampled_from(["finance", "security", "runtime"]),
                                "count": st.sampled_from([1, 2, 0, True, 1.0])},
                               optional={"signature": st.sampled_from(["webauthn", "x"])})
#: Values a member may hold that print alike or compare equal (``NaN`` prints ``null`` in
#: orjson, ``1 == 1.0 == True``) but validate otherwise.
_alike = st.sampled_from([None, float("nan"), 1, 1.0, True, "webauthn", Text("webauthn"),
                          "mfa", {"max_ttl_s": 60, "max_uses": 1},
                          {"max_ttl_s": 60.0, "max_uses": 1}])
_approval = st.fixed_dictionaries(
    {"require": _lists(_group)},
    optional={"timeout_ms": st.sampled_from([1_800_000, 0, True, 1_800_000.0]),
              "distinct_from": st.sampled_from(["initiator", "previous", "nobody"]),
              "break_glass": _alike, "signature": _alike, "standing": _alike,
              "assurance": _alike, "on_expired": _alike | st.fixed_dictionaries(
                  {"require": _lists(_group)}),
              "other": _scalars}) | _scalars
_results = st.fixed_dictionaries({}, optional={
    "effect": st.sampled_from(["allow", "deny", "require_approval", "maybe"])
    | st.sampled_from(["allow", "deny"]).map(Text) | _scalars,
    "reasons": _lists(_reason) | _scalars,
    "approval": _approval,
    "mask": _lists(_strings | st.integers()) | st.just(()) | _scalars,
    "permit_ttl_s": _scalars,
    "unexpected": _scalars,
}) | _scalars | _lists(_scalars)


def _exact(value: Any) -> Any:
    """``value`` with the type of every part spelled out (``1 == True``, ``Text("a") ==
    "a"``: a shared result must not hand back another type than the rule gave)."""
    if isinstance(value, PolicyResult | Reason):
        return (type(value), tuple(_exact(getattr(value, name))
                                   for name in value.__slots__))  # type: ignore[union-attr]
    if isinstance(value, tuple):
        return (tuple, tuple(_exact(v) for v in value))
    return (type(value), value)


def _outcome(check: Any, raw: Any) -> Any:
    try:
        return _exact(check(raw))
    except PolicyError as exc:
        return ("refused", exc.detail)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_results)
def test_validate_result_decides_as_before(raw: Any) -> None:
    expected = _outcome(_reference, raw)
    assert _outcome(validate_result, raw) == expected
    assert _outcome(validate_result, raw) == expected  # again: a shared result (session 10)


@settings(max_examples=2000, deadline=None)
@given(st.lists(_results, min_size=2, max_size=6))
def test_shared_results_never_answer_for_another_result(raws: list[Any]) -> None:
    """Results kept for plain allow/deny (session 10): whatever was seen before, each
    result is the one the plain validation gives."""
    for raw in raws + raws[::-1]:
        assert _outcome(validate_result, raw) == _outcome(_reference, raw)


_LOOKALIKES = [  # equal keys (1 == True == 1.0, Text("a") == "a") but other results
    {"effect": "allow", "permit_ttl_s": 1}, {"effect": "allow", "permit_ttl_s": True},
    {"effect": "allow", "permit_ttl_s": 1.0}, {"effect": "allow", "reasons": ["a"]},
    {"effect": "allow", "reasons": [Text("a")]}, {"effect": "allow", "reasons": [{"code": "a"}]},
    {"effect": "allow", "reasons": [{"code": Text("a")}]},
    {"effect": "allow", "reasons": [{"code": "a", "message": Text("")}]},
    {"effect": Text("allow")}, {"effect": "allow"}, {"effect": "allow", "reasons": ("a",)},
    {"effect": "allow", "reasons": [{"code": "a", "message": "m", "x": 1}]},
    {"effect": "allow", "reasons": [1]}, {"effect": "allow", "reasons": None},
    {"effect": "allow", "approval": None}, {"effect": "allow", "permit_ttl_s": 0}]


_GATE = {"require": [{"role": "finance", "count": 1}]}
_LOOKALIKES += [  # require_approval: alike in print or equality, other results
    {"effect": "require_approval", "approval": {**_GATE, "signature": member}}
    for member in (None, float("nan"), "webauthn", Text("webauthn"))] + [
    {"effect": "require_approval", "approval": {**_GATE, "standing": member}}
    for member in (None, float("nan"), {"max_ttl_s": 60, "max_uses": 1},
                   {"max_ttl_s": 60.0, "max_uses": 1}, {"max_ttl_s": True, "max_uses": 1})] + [
    {"effect": "require_approval", "approval": {**_GATE, "timeout_ms": member}}
    for member in (1, 1.0, True)] + [
    {"effect": "require_approval", "approval": {"require": [{"role": "finance", "count": c}]}}
    for c in (1, 1.0, True)] + [
    {"effect": "require_approval", "approval": {"require": [{"role": Text("finance")}]}},
    {"effect": "require_approval", "approval": _GATE, "mask": []},
    {"effect": "require_approval", "approval": {**_GATE, "on_expired": None}},
    {"effect": "require_approval", "approval": {**_GATE, "on_expired": float("nan")}}]


@pytest.mark.parametrize("first", range(len(_LOOKALIKES)))
def test_shared_results_tell_lookalikes_apart(first: int) -> None:
    result_module._results.clear()
    for raw in _LOOKALIKES[first:] + _LOOKALIKES[:first] + _LOOKALIKES[::-1]:
        assert _outcome(validate_result, raw) == _outcome(_reference, raw), raw


def test_shared_results_are_bounded_and_skip_subclasses() -> None:
    raw = {"effect": "allow", "reasons": [{"code": "a", "message": "m"}], "permit_ttl_s": 5}
    assert validate_result(raw) is validate_result(dict(raw))
    assert validate_result({"effect": "allow", "reasons": ["a"]}) is validate_result(
        {"effect": "allow", "reasons": [{"code": "a"}]})  # the same value: Reason("a", "")
    subclassed = validate_result({"effect": "allow", "reasons": [Text("a")]})
    assert type(subclassed.reasons[0].code) is Text
    assert type(validate_result({"effect": "allow", "reasons": ["a"]}).reasons[0].code) is str
    with pytest.raises(PolicyError):
        validate_result({"effect": "allow", "permit_ttl_s": True})
    for i in range(result_module._MAX_RESULTS + 5):
        validate_result({"effect": "deny", "reasons": [f"r{i}"]})
    assert len(result_module._results) <= result_module._MAX_RESULTS


def test_a_require_approval_is_shared_when_its_approval_is_plain_json() -> None:
    raw = {"effect": "require_approval", "reasons": ["big"],
           "approval": {"timeout_ms": 60_000, "require": [{"role": "finance", "count": 1}]}}
    first = validate_result(raw)
    assert first is validate_result({**raw, "approval": dict(raw["approval"])})
    assert first.approval == parse_requirement(raw["approval"])
    floated = {**raw, "approval": {**raw["approval"], "timeout_ms": 60_000.0}}
    with pytest.raises(PolicyError):  # never answered by the shared result
        validate_result(floated)
    assert validate_result({**raw, "mask": ["/args/a"]}) is not first


@pytest.mark.parametrize("raw", [
    {"effect": "allow", "mask": ()}, {"effect": "allow", "reasons": ("a",)},
    {"effect": "allow", "reasons": [{"code": "a", "message": "b", "c": 1}]},
    {"effect": "allow", "mask": None}, {"effect": "allow", "extra": 1}])
def test_near_misses_are_still_refused(raw: Any) -> None:
    with pytest.raises(PolicyError):
        validate_result(raw)


def test_reasons_are_shared_values_and_bounded() -> None:
    first = validate_result({"effect": "allow", "reasons": [{"code": "a", "message": "m"}]})
    again = validate_result({"effect": "deny", "reasons": [{"code": "a", "message": "m"}]})
    assert first.reasons[0] is again.reasons[0] == Reason("a", "m")
    subclassed = validate_result({"effect": "allow", "reasons": [Text("a")]}).reasons[0]
    assert type(subclassed.code) is Text  # the rule's own object, as before
    for i in range(result_module._MAX_REASONS + 5):
        validate_result({"effect": "allow", "reasons": [f"r{i}"]})
    assert len(result_module._reasons) <= result_module._MAX_REASONS
