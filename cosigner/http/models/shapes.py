"""Fast proofs that a hot route's body fits its wire model (issue 20).

``DecisionRequestV1.model_validate(data, strict=True)`` costs several times the hand
check below for the common valid body. Each ``*_fits(data)`` returns True only when the
model, validated strictly, surely accepts ``data``; anything it does not recognise
(another type, a bound, a pattern, an unusual character) returns False, and the route
then validates with pydantic, so every error is pydantic's own. In strict mode pydantic
converts nothing, so an accepted body's values are ``data``'s own (``request_id``,
``mode`` defaulting to ``"on"``).

``data`` is a JSON value as :func:`cosigner.core.canonical.parse_json` returns it (dicts
with ``str`` keys, lists, ``str``, ``int``, ``float``, ``bool``, ``None``).
tests/http/test_shapes.py checks with hypothesis that no body is accepted here that
pydantic refuses, on generated valid and near-valid bodies.
"""

from __future__ import annotations

import re
from typing import Any

#: ``TOOL_PATTERN`` of the models (ASCII only, so no surrogate passes it).
_TOOL = re.compile(r"[A-Za-z0-9_.:/-]+")
_SURROGATE = re.compile("[\ud800-\udfff]")
_DECISION = frozenset({"request_id", "run", "principal", "initiator", "tool", "args",
                       "context", "mode"})
_DECISION_REQUIRED = frozenset({"request_id", "run", "principal", "initiator", "tool",
                                "args"})
_RUN = frozenset({"id", "step", "trace_id"})
_PARTY = frozenset({"id", "type"})
_TOOL_REF = frozenset({"name", "version", "side_effect"})
_SIDE_EFFECTS = frozenset({"none", "read", "write", "financial", "destructive"})
_REDEEM = frozenset({"permit", "tool", "args"})


def _text(value: Any, most: int, least: int = 1) -> bool:
    """A ``str`` of ``least``..``most`` characters without NUL (``TEXT_PATTERN``) and
    without lone surrogates (pydantic cannot read those)."""
    return (type(value) is str and least <= len(value) <= most and "\x00" not in value
            and (value.isascii() or _SURROGATE.search(value) is None))


def _tool_name(value: Any) -> bool:
    return type(value) is str and len(value) <= 256 and _TOOL.fullmatch(value) is not None


def _run(run: Any) -> bool:
    """``RunRefV1``."""
    if type(run) is not dict or not run.keys() <= _RUN or not _text(run.get("id"), 256):
        return False
    step = run.get("step")
    trace = run.get("trace_id")
    return ((step is None or (type(step) is int and step >= 0))
            and (trace is None or _text(trace, 256, 0)))


def _party(party: Any) -> bool:
    """``PartyV1``."""
    if type(party) is not dict:
        return False
    id_ = party.get("id")
    kind = party.get("type", "-")
    # the usual party: two short ASCII strings (``_text``'s test, spelled inline)
    if (type(id_) is str and type(kind) is str and id_.isascii() and kind.isascii()
            and 1 <= len(id_) <= 256 and 1 <= len(kind) <= 64
            and "\x00" not in id_ and "\x00" not in kind):
        return party.keys() <= _PARTY
    return (party.keys() <= _PARTY and _text(id_, 256)
            and ("type" not in party or _text(party["type"], 64)))


def _tool_ref(tool: Any) -> bool:
    """``ToolRefV1``."""
    if type(tool) is not dict or not tool.keys() <= _TOOL_REF:
        return False
    version = tool.get("version")
    side_effect = tool.get("side_effect")
    return (_tool_name(tool.get("name")) and (version is None or _text(version, 64, 0))
            and (side_effect is None or (type(side_effect) is str
                                         and side_effect in _SIDE_EFFECTS)))


def decision_request_fits(data: Any) -> bool:
    """True only when ``DecisionRequestV1`` (strict) accepts ``data``."""
    if type(data) is not dict:
        return False
    keys = data.keys()
    return (keys <= _DECISION and _DECISION_REQUIRED <= keys
            and _text(data["request_id"], 256) and _run(data["run"])
            and _party(data["principal"]) and _party(data["initiator"])
            and _tool_ref(data["tool"]) and type(data["args"]) is dict
            and type(data.get("context", data)) is dict
            and data.get("mode", "on") in ("on", "shadow"))


def redeem_request_fits(data: Any) -> bool:
    """True only when ``RedeemRequestV1`` (strict) accepts ``data``."""
    if type(data) is not dict or data.keys() != _REDEEM:
        return False
    permit = data["permit"]
    return (type(permit) is str and 1 <= len(permit) <= 16_384
            and (permit.isascii() or _SURROGATE.search(permit) is None)
            and _tool_name(data["tool"]) and type(data["args"]) is dict)
