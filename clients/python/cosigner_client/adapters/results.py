"""The reply half: turn what a gated call did into the message a model API expects.

* :func:`anthropic_tool_result` → ``{"type": "tool_result", "tool_use_id", "content",
  "is_error"}`` (Anthropic Messages API);
* :func:`openai_tool_output` → ``{"type": "function_call_output", "call_id", "output"}``
  (OpenAI Responses API); :func:`openai_tool_message` → ``{"role": "tool",
  "tool_call_id", "content"}`` (Chat Completions).

``result`` is a :class:`~cosigner_client.models.CallResult` (``gate.call``), a
:class:`~cosigner_client.pause.Refusal` (what ``@cosigned`` returns when the body did not
run), or the tool's own return value. A refusal is marked as an error where the API can
say so, and its text tells the model what happened; nothing was executed.
"""

from __future__ import annotations

import json
from typing import Any

from cosigner_client.models import CallResult
from cosigner_client.pause import Refusal, refusal_text

__all__ = ["anthropic_tool_result", "openai_tool_message", "openai_tool_output", "text_of"]


def _content(value: Any) -> str:
    if isinstance(value, str):
        return str(value)
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except ValueError:  # circular
        return str(value)


def text_of(result: Any) -> tuple[str, bool]:
    """``(text for the model, is_error)``."""
    if isinstance(result, CallResult):
        if result.executed:
            return _content(result.value), False
        return refusal_text(result), True
    if isinstance(result, Refusal):
        return str(result), True
    return _content(result), False


def anthropic_tool_result(tool_use_id: str, result: Any) -> dict[str, Any]:
    """An Anthropic ``tool_result`` content block (``is_error`` when it did not run)."""
    text, is_error = text_of(result)
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": text,
            "is_error": is_error}


def openai_tool_output(call_id: str, result: Any) -> dict[str, Any]:
    """An OpenAI Responses ``function_call_output`` item (the refusal text as output)."""
    return {"type": "function_call_output", "call_id": call_id, "output": text_of(result)[0]}


def openai_tool_message(tool_call_id: str, result: Any) -> dict[str, Any]:
    """An OpenAI Chat Completions ``tool`` message."""
    return {"role": "tool", "tool_call_id": tool_call_id, "content": text_of(result)[0]}
