"""OpenAI Agents SDK (``openai-agents``): tools whose ``needs_approval`` is Cosigner's
decision, interruptions that carry the approval id and review URL, and resumption of a
serialized ``RunState`` that runs an approved call exactly once.

    gate = AsyncGate(url, key, run="run-7", principal=..., initiator=...)
    agent = Agent(name="support", tools=[cosigned_tool(gate, issue_refund)])
    result = await Runner.run(agent, "refund the duplicate charge")
    for paused in await pending_approvals(gate, result.interruptions):
        print(paused.approval_id, paused.review_url)        # send people there
    saved = result.to_state().to_string()
    ...                                                   # later, in any process:
    state = await RunState.from_string(agent, saved)
    await apply_approvals(gate, state)                    # Cosigner's answer, not the model's
    result = await Runner.run(agent, state)

Each proposed call is decided under a request id derived from (run, tool, the model's call
id), so the process that resumes gets the first decision back (and its approval id) instead
of opening a new request. A denied call returns a refusal the model reads; the body never
runs. An approved call is redeemed (single use) right before it runs: resuming the same
saved state twice runs it once (the second finds the permit ``already_redeemed``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from agents import FunctionTool, RunContextWrapper, RunState, function_tool
from agents.items import ToolApprovalItem
from agents.tool_context import ToolContext

from cosigner_client.canonical import parse_json
from cosigner_client.gate import AsyncGate
from cosigner_client.models import Decision
from cosigner_client.pause import (
    Paused,
    acheck,
    aread_approval,
    aresume,
    arun_decided,
    paused_of,
    refusal_text,
    stable_request_id,
)

__all__ = ["apply_approvals", "cosigned_tool", "pending_approvals"]


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _request_id(gate: AsyncGate, tool: str, call_id: str) -> str:
    run = gate.run
    if run is None:
        raise ValueError("the gate has no run: pass run= or call start_run() first")
    return stable_request_id("openai-agents", str(run["id"]), tool, call_id)


async def _decide(gate: AsyncGate, tool: str, args: dict[str, Any], call_id: str
                  ) -> tuple[Decision, Paused | None]:
    # The body must be identical wherever this call is decided again (a replay), so it
    # holds only what the saved run state knows: run, tool, call id and arguments.
    return await acheck(gate, tool, args, request_id=_request_id(gate, tool, call_id))


def cosigned_tool(gate: AsyncGate, fn: Callable[..., Any], *, name: str | None = None,
                  side_effect: str | None = None, cost_minor: Any = None,
                  **function_tool_kwargs: Any) -> FunctionTool:
    """A ``FunctionTool`` for ``fn`` (sync or async; name defaults to ``fn.__name__``)
    gated by Cosigner: ``needs_approval`` asks Cosigner (``require_approval`` → the run
    is interrupted); on invocation an allowed or approved call is redeemed, run once and
    reported, anything else returns a refusal string to the model."""
    base = function_tool(fn, name_override=name, **function_tool_kwargs)
    tool_name = base.name
    decided: dict[str, Decision] = {}  # this process's decisions, by request id

    async def needs_approval(_ctx: RunContextWrapper[Any], params: dict[str, Any],
                             call_id: str) -> bool:
        decision, paused = await _decide(gate, tool_name, dict(params), call_id)
        decided[decision.request_id] = decision
        return paused is not None

    async def invoke(ctx: ToolContext[Any], raw_args: str) -> Any:
        args = parse_json(raw_args or "{}")
        if type(args) is not dict:
            return "Cosigner refused this call (arguments are not an object)."
        rid = _request_id(gate, tool_name, ctx.tool_call_id)
        decision = decided.pop(rid, None)
        if decision is None:  # another process decided it: the server replays the answer
            decision, _ = await _decide(gate, tool_name, args, ctx.tool_call_id)
        paused = paused_of(decision, tool_name, args)
        if paused is not None:
            result = await aresume(gate, paused.approval_id, fn, tool=tool_name, args=args,
                                   side_effect=side_effect, cost_minor=cost_minor)
        else:
            result = await arun_decided(gate, decision, tool_name, args, fn,
                                        side_effect=side_effect, cost_minor=cost_minor)
        if not result.executed:
            return refusal_text(result)
        value = result.value
        return await value if inspect.isawaitable(value) else value

    return FunctionTool(name=tool_name, description=base.description,
                        params_json_schema=base.params_json_schema, on_invoke_tool=invoke,
                        strict_json_schema=base.strict_json_schema,
                        needs_approval=needs_approval)


def _call_of(item: ToolApprovalItem) -> tuple[str, dict[str, Any], str] | None:
    raw = item.raw_item
    name, arguments, call_id = _get(raw, "name"), _get(raw, "arguments"), _get(raw, "call_id")
    if not isinstance(name, str) or not isinstance(call_id, str):
        return None
    args = parse_json(arguments or "{}") if isinstance(arguments, str) else None
    return (name, args, call_id) if type(args) is dict else None


async def pending_approvals(gate: AsyncGate, interruptions: Iterable[ToolApprovalItem]
                            ) -> list[Paused]:
    """The Cosigner approval (id, review URL, call) behind each interruption; the
    decision is replayed by its request id, so this works in any process."""
    found = []
    for item in interruptions:
        call = _call_of(item)
        if call is None:
            continue
        name, args, call_id = call
        _, paused = await _decide(gate, name, args, call_id)
        if paused is not None:
            found.append(paused)
    return found


async def apply_approvals(gate: AsyncGate, state: RunState[Any, Any]) -> list[Paused]:
    """Copy Cosigner's answers into ``state``: approved → ``state.approve(item)``;
    rejected / expired / cancelled → ``state.reject(item)`` with a message the model reads.
    Returns the calls still waiting (their items stay interrupted)."""
    waiting = []
    for item in state.get_interruptions():
        call = _call_of(item)
        if call is None:
            continue
        name, args, call_id = call
        decision, paused = await _decide(gate, name, args, call_id)
        if paused is None:
            if decision.effect == "allow":
                state.approve(item)
            else:
                state.reject(item, rejection_message=refusal_text(decision))
            continue
        approval = await aread_approval(gate, paused.approval_id)
        if approval.status == "approved":
            state.approve(item)
        elif approval.status in ("rejected", "expired", "cancelled"):
            state.reject(item, rejection_message=(
                f"A reviewer did not approve this call ({approval.status}). "
                "It was not executed."))
        else:
            waiting.append(paused)
    return waiting
