"""The hand checks of the hot routes' bodies (cosigner.http.models.shapes) never accept what
the pydantic wire models refuse, and what they accept pydantic reads as the body's own
values (issue 20): hypothesis bodies near the valid shape, every field valid or broken."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from cosigner.http.models.approvals import RedeemRequestV1
from cosigner.http.models.decisions import DecisionRequestV1
from cosigner.http.models.shapes import decision_request_fits, redeem_request_fits

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=3),
                    lambda inner: st.lists(inner, max_size=2)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=2), max_leaves=3)
#: Values near the models' bounds and patterns: empty, 64/65/256/257 long, NUL, lone
#: surrogates, non-ASCII (BMP and not), newlines, spaces, literal look-alikes, other types.
ODD = st.one_of(
    st.sampled_from(["", "x" * 64, "x" * 65, "é" * 256, "é" * 257, "y" * 256, "y" * 257,
                     "a\x00b", "a\ud800", "\udfff", "😀", "a\n", "\n", "bad tool", "ON",
                     "off", "Read", 2**63, 2**70, -1, True, False, 1.0, None, [], {}]),
    st.integers(-2**64, -1), st.text(alphabet="ab._:/-\x00\ud800é\n ", max_size=4), JSON)
#: Valid values of each kind.
TEXT = st.one_of(st.text(st.characters(exclude_characters="\x00", codec="utf-8"),
                         min_size=1, max_size=6), st.sampled_from(["x" * 256, "é" * 256]))
NAME = st.one_of(st.from_regex(r"[A-Za-z0-9_.:/-]{1,8}", fullmatch=True),
                 st.just("n" * 256))
OBJECT = st.dictionaries(st.text(max_size=4), JSON, max_size=3)


def optional(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects holding any subset of ``fields``."""
    return st.fixed_dictionaries({}, optional=fields)


RUN = st.fixed_dictionaries({"id": TEXT}, optional={
    "step": st.none() | st.integers(0, 2**64), "trace_id": st.none() | TEXT | st.just("")})
PARTY = st.fixed_dictionaries({"id": TEXT}, optional={"type": TEXT})
TOOL = st.fixed_dictionaries({"name": NAME}, optional={
    "version": st.none() | st.just("") | TEXT,
    "side_effect": st.none() | st.sampled_from(["none", "read", "write", "financial",
                                                "destructive"])})
VALID_DECISION = st.fixed_dictionaries(
    {"request_id": TEXT, "run": RUN, "principal": PARTY, "initiator": PARTY, "tool": TOOL,
     "args": OBJECT}, optional={"context": OBJECT, "mode": st.sampled_from(["on", "shadow"])})
VALID_REDEEM = st.fixed_dictionaries({
    "permit": st.one_of(TEXT, st.just("t" * 16_384), st.just("a\x00")), "tool": NAME,
    "args": OBJECT})
KEYS = ["id", "step", "trace_id", "type", "name", "version", "side_effect", "mode",
        "context", "args", "extra", ""]
#: Near misses by field name (any odd value may land anywhere, these land where they bite).
NEAR = {"step": [-1, -(2**64), True, 1.0, "1", 2**70], "type": ["", "t" * 64, "t" * 65, None],
        "name": ["", "n" * 257, "bad tool", "é", "a\n", None], "version": ["v" * 65, "\x00"],
        "side_effect": ["Read", "", "deleting"], "mode": ["off", "ON", None],
        "permit": ["", "t" * 16_385, "a\ud800", None], "tool": ["n" * 257, "x y", []],
        "request_id": ["", "r" * 257, "a\x00"], "id": ["", "i" * 257, "\udfff"],
        "trace_id": ["t" * 257, "\x00"], "args": [[], None, "{}"], "context": [None, []]}


def odd(key: str) -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(NEAR[key]), ODD) if key in NEAR else ODD


@st.composite
def near(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> Any:
    """A valid body with up to two faults: a value replaced by an odd one, a field
    dropped or an unknown (or optional) one added, at the top or one level down."""
    body = draw(valid)
    for _ in range(draw(st.integers(0, 2))):
        objects = [body, *(v for v in body.values() if isinstance(v, dict))]
        target = draw(st.sampled_from(objects))
        action = draw(st.sampled_from(["replace", "drop", "add"]))
        if action == "add" or not target:
            key = draw(st.sampled_from(KEYS))
            target[key] = draw(odd(key))
        elif action == "replace":
            key = draw(st.sampled_from(sorted(target)))
            target[key] = draw(odd(key))
        else:
            target.pop(draw(st.sampled_from(sorted(target))))
    return body if draw(st.integers(0, 19)) else draw(ODD)


DECISION = near(VALID_DECISION)
REDEEM = near(VALID_REDEEM)


def pydantic_reads(model: type[BaseModel], data: Any) -> BaseModel | None:
    try:
        return model.model_validate(data, strict=True)
    except ValidationError:
        return None


def check(model: type[BaseModel], fits: bool, data: Any) -> None:
    validated = pydantic_reads(model, data)
    if fits:
        assert validated is not None, data
        # Nothing converted: the model holds exactly the body (the routes read the body).
        assert validated.model_dump(exclude_unset=True) == data


@settings(max_examples=800)
@given(DECISION)
def test_decision_check_accepts_only_what_pydantic_accepts(data: Any) -> None:
    check(DecisionRequestV1, decision_request_fits(data), data)
    if decision_request_fits(data):
        validated = pydantic_reads(DecisionRequestV1, data)
        assert isinstance(validated, DecisionRequestV1)
        assert (validated.request_id, validated.mode) == (data["request_id"],
                                                          data.get("mode", "on"))


@settings(max_examples=400)
@given(REDEEM)
def test_redeem_check_accepts_only_what_pydantic_accepts(data: Any) -> None:
    check(RedeemRequestV1, redeem_request_fits(data), data)


USUAL_DECISION = {"request_id": "req-1", "run": {"id": "run-1", "step": 1},
                  "principal": {"id": "customer-42", "type": "customer"},
                  "initiator": {"id": "agent-support", "type": "agent"},
                  "tool": {"name": "issue_refund", "side_effect": "financial"},
                  "args": {"order_id": "ord_8472", "amount_minor": 5000}, "context": {}}
USUAL_REDEEM = {"permit": "a.b.c", "tool": "issue_refund", "args": {}}
#: Values at the bounds, valid and not, by field name.
BOUNDS = {**{k: list(v) for k, v in NEAR.items()},
          "step": [*NEAR["step"], 0, 2**70, None], "type": [*NEAR["type"], "t" * 64, "é"],
          "name": [*NEAR["name"], "n" * 256, "a.b:c/d-e_f"],
          "version": [*NEAR["version"], "v" * 64, "", None],
          "side_effect": ["read", None], "mode": ["on", "shadow"],
          "permit": [*NEAR["permit"], "t" * 16_384, "a\x00"],
          "tool": [*NEAR["tool"], "n" * 256, "é"], "request_id": [*NEAR["request_id"], "r" * 256],
          "id": [*NEAR["id"], "i" * 256, "é" * 256], "trace_id": [*NEAR["trace_id"], "", None]}


def _variants(body: dict[str, Any]) -> list[Any]:
    """``body`` with each field (top level and one level down, present or not) set to each
    of its bound values, dropped, and with an unknown field added."""
    out: list[Any] = [{**body, "extra": 1}]
    for key, value in body.items():
        out.append({k: v for k, v in body.items() if k != key})
        for bound in BOUNDS.get(key, []):
            out.append({**body, key: bound})
        if isinstance(value, dict):
            for inner in ("id", "step", "trace_id", "type", "name", "version", "side_effect"):
                for bound in BOUNDS[inner]:
                    out.append({**body, key: {**value, inner: bound}})
    return out


def test_each_bound_on_the_usual_bodies() -> None:
    """Every bound of every field, on the usual bodies: the hand check accepts a variant
    only when pydantic does, and the usual bodies themselves (the fast path must run)."""
    assert decision_request_fits(USUAL_DECISION) and redeem_request_fits(USUAL_REDEEM)
    accepted = 0
    for body in _variants(USUAL_DECISION):
        check(DecisionRequestV1, decision_request_fits(body), body)
        accepted += decision_request_fits(body)
    for body in _variants(USUAL_REDEEM):
        check(RedeemRequestV1, redeem_request_fits(body), body)
        accepted += redeem_request_fits(body)
    assert accepted > 20
