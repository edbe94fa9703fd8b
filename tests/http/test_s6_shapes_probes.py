"""Review probes of the hand body checks (cosigner.http.models.shapes, session 6): bodies an
attacker would try — boundary lengths, newlines before the end of a pattern, non-ASCII
look-alikes, bool-for-int, null members, duplicated meaning — never pass the hand check
where pydantic (strict) refuses them."""

from __future__ import annotations

import copy
from typing import Any

from pydantic import ValidationError

from cosigner.http.models.approvals import RedeemRequestV1
from cosigner.http.models.decisions import DecisionRequestV1
from cosigner.http.models.shapes import decision_request_fits, redeem_request_fits
from tests.conftest import decision_request

_ODD_TEXTS = ["", "a", "a\n", "\n", "a\x00", "\x00", "\u0000b", "x" * 256, "x" * 257,
              "x" * 64, "x" * 65, "é" * 256, "é" * 257, "\U0001f600" * 256,
              "\U0001f600" * 257, "\u2028", "a\r\n", " ", "ａ", "١"]
_ODD_VALUES: list[Any] = [*_ODD_TEXTS, None, True, False, 0, -1, 1, 1.0, [], {}, ["a"],
                          {"id": "a"}]
_PATHS = [("request_id",), ("run",), ("run", "id"), ("run", "step"), ("run", "trace_id"),
          ("principal",), ("principal", "id"), ("principal", "type"), ("initiator", "id"),
          ("initiator", "type"), ("tool",), ("tool", "name"), ("tool", "version"),
          ("tool", "side_effect"), ("args",), ("context",), ("mode",)]
_TOOL_NAMES = ["a", "a.b:c/d-e_f", "a\n", "a b", "ａ", "a" * 256, "a" * 257, "", "a$",
               "A-Z", "\u0661", "a\x00"]


def _accepts(model: Any, data: Any) -> bool:
    try:
        model.model_validate(data, strict=True)
    except ValidationError:
        return False
    return True


def _bodies() -> list[dict[str, Any]]:
    base = decision_request(run={"id": "r", "step": 1, "trace_id": "t"},
                            tool={"name": "issue_refund", "version": "1",
                                  "side_effect": "write"}, context={}, mode="on")
    out = []
    for path in _PATHS:
        for value in [*_ODD_VALUES, *_TOOL_NAMES, "shadow", "off", "destructive", "none",
                      2**53, 0]:
            body = copy.deepcopy(base)
            target = body
            for part in path[:-1]:
                target = target[part]
            target[path[-1]] = value
            out.append(body)
        body = copy.deepcopy(base)
        target = body
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]
        out.append(body)
    for extra in ({"tenant_id": "other"}, {"approved": True}):
        out.append({**base, **extra})
        out.append({**base, "run": {**base["run"], **extra}})
        out.append({**base, "tool": {**base["tool"], **extra}})
        out.append({**base, "principal": {**base["principal"], **extra}})
    return out


def test_no_decision_body_fits_that_pydantic_refuses() -> None:
    checked = 0
    for body in _bodies():
        if decision_request_fits(body):
            checked += 1
            assert _accepts(DecisionRequestV1, body), body
    assert checked > 50  # the probe reached the fast road often


def test_no_redeem_body_fits_that_pydantic_refuses() -> None:
    base = {"permit": "a.b.c", "tool": "issue_refund", "args": {}}
    fitted = 0
    for key in ("permit", "tool", "args"):
        for value in [*_ODD_VALUES, *_TOOL_NAMES, "p" * 16_384, "p" * 16_385,
                      "\U0001f600" * 16_384]:
            body = {**base, key: value}
            if redeem_request_fits(body):
                fitted += 1
                assert _accepts(RedeemRequestV1, body), body
        body = dict(base)
        del body[key]
        assert not redeem_request_fits(body)
    assert not redeem_request_fits({**base, "tenant": "x"})
    assert fitted > 10
