"""Turn what runtimes hold — an OpenAI-style function call or an Anthropic ``tool_use``
block — into a gate call (tool name + exact arguments).

The model wrote these; nothing in them carries authority. They are parsed strictly (the
same rules as the server: duplicate keys, NaN, unsafe integers refused) so the arguments
hashed are exactly the arguments that run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cosigner_client.canonical import check_hashable, parse_json
from cosigner_client.errors import InvalidArguments

__all__ = ["ToolCall", "from_anthropic", "from_openai"]

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,256}$")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A proposed call: ``gate.call(tc.name, tc.args, fn)``. ``id`` is the framework's."""

    name: str
    args: dict[str, Any]
    id: str | None = None


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def _name(value: Any) -> str:
    if not isinstance(value, str) or not _TOOL_NAME.match(value):
        raise InvalidArguments("tool call has no valid name", code="invalid_tool_call")
    return value


def from_openai(call: Any) -> ToolCall:
    """From ``{"name", "arguments": "<json>"}``, or a chat-completions tool call
    ``{"id", "type": "function", "function": {...}}`` (dicts or SDK objects).

    Raises:
        InvalidArguments: no valid name; ``arguments`` not a JSON *string* holding an
            object; or JSON the server would refuse (codes as :func:`parse_json`).
    """
    function = _get(call, "function")
    inner = function if function is not None else call
    raw = _get(inner, "arguments")
    if not isinstance(raw, str):
        raise InvalidArguments("arguments must be a JSON string", code="invalid_tool_call")
    args = parse_json(raw)
    if type(args) is not dict:
        raise InvalidArguments("arguments must be a JSON object", code="invalid_tool_call")
    call_id = _get(call, "id") if function is not None else _get(call, "call_id")
    return ToolCall(name=_name(_get(inner, "name")), args=args,
                    id=call_id if isinstance(call_id, str) else None)


def from_anthropic(block: Any) -> ToolCall:
    """From a ``tool_use`` content block ``{"type": "tool_use", "id", "name", "input"}``.

    Raises:
        InvalidArguments: not a ``tool_use`` block, no valid name, ``input`` not an object,
            or values the server would refuse.
    """
    kind = _get(block, "type")
    if kind is not None and kind != "tool_use":
        raise InvalidArguments(f"not a tool_use block ({kind})", code="invalid_tool_call")
    args = _get(block, "input")
    if type(args) is not dict:
        raise InvalidArguments("input must be a JSON object", code="invalid_tool_call")
    check_hashable(args)
    block_id = _get(block, "id")
    return ToolCall(name=_name(_get(block, "name")), args=args,
                    id=block_id if isinstance(block_id, str) else None)
