"""Pydantic AI: deferred tools (``ApprovalRequired`` / ``DeferredToolRequests``) resolved
from Cosigner's approval state.

    agent = Agent(model, tools=[cosigned_tool(gate, issue_refund)],
                  output_type=[str, DeferredToolRequests])
    result = await agent.run("refund the duplicate charge")
    if isinstance(result.output, DeferredToolRequests):
        for meta in result.output.metadata.values():
            print(meta["approval_id"], meta["review_url"])     # send people there
        ...                                                   # later:
        results, waiting = await approval_results(gate, result.output)
        if not waiting:
            result = await agent.run(message_history=result.all_messages(),
                                     deferred_tool_results=results)

A tool call Cosigner allows is redeemed and run once; a denied one returns a refusal the
model reads; ``require_approval`` raises ``ApprovalRequired`` with the approval id and
review URL as metadata. :func:`approval_results` answers each deferred approval from
Cosigner (approved → ``ToolApproved``; rejected / expired / cancelled → ``ToolDenied``;
still pending → left out, listed in ``waiting``). Approving in Pydantic AI alone changes
nothing: the resumed tool reads Cosigner's approval, redeems the single-use permit and
runs once; a second resume returns the ``already_redeemed`` refusal.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from pydantic_ai import RunContext, Tool
from pydantic_ai.exceptions import ApprovalRequired
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied

from cosigner_client.gate import AsyncGate
from cosigner_client.pause import (
    Paused,
    acheck,
    aread_approval,
    aresume,
    arun_decided,
    refusal_text,
    stable_request_id,
)

__all__ = ["approval_results", "cosigned_tool"]


def _request_id(gate: AsyncGate, tool: str, call_id: str) -> str:
    run = gate.run
    if run is None:
        raise ValueError("the gate has no run: pass run= or call start_run() first")
    return stable_request_id("pydantic-ai", str(run["id"]), tool, call_id)


def cosigned_tool(gate: AsyncGate, fn: Callable[..., Any], *, name: str | None = None,
                  side_effect: str | None = None, cost_minor: Any = None) -> Tool[Any]:
    """A Pydantic AI ``Tool`` for ``fn`` (sync or async; name defaults to ``fn.__name__``)
    whose every call goes through Cosigner (see the module docstring)."""
    base = Tool(fn, name=name, takes_ctx=False)
    tool_name = base.name

    async def run(ctx: RunContext[Any], **args: Any) -> Any:
        call_id = str(ctx.tool_call_id)
        meta = ctx.tool_call_metadata if isinstance(ctx.tool_call_metadata, dict) else {}
        approval_id = meta.get("approval_id") if ctx.tool_call_approved else None
        if not isinstance(approval_id, str):
            decision, paused = await acheck(gate, tool_name, args,
                                            request_id=_request_id(gate, tool_name, call_id))
            if paused is not None and not ctx.tool_call_approved:
                raise ApprovalRequired(metadata=paused.as_dict())
            approval_id = paused.approval_id if paused is not None else None
        if isinstance(approval_id, str):
            result = await aresume(gate, approval_id, fn, tool=tool_name, args=args,
                                   side_effect=side_effect, cost_minor=cost_minor)
        else:
            result = await arun_decided(gate, decision, tool_name, args, fn,
                                        side_effect=side_effect, cost_minor=cost_minor)
        if not result.executed:
            return refusal_text(result)
        value = result.value
        return await value if inspect.isawaitable(value) else value

    return Tool.from_schema(run, name=tool_name, description=base.description,
                            json_schema=base.function_schema.json_schema, takes_ctx=True)


async def approval_results(gate: AsyncGate, requests: DeferredToolRequests
                           ) -> tuple[DeferredToolResults, list[Paused]]:
    """``DeferredToolResults`` for the approvals Cosigner has settled, and the calls still
    waiting. Each result carries the approval id back to the tool as metadata."""
    results, waiting = DeferredToolResults(), []
    for part in requests.approvals:
        meta = requests.metadata.get(part.tool_call_id) or {}
        approval_id = meta.get("approval_id")
        if not isinstance(approval_id, str):
            continue  # not one of Cosigner's
        approval = await aread_approval(gate, approval_id)
        if approval.status == "approved":
            results.approvals[part.tool_call_id] = ToolApproved()
            results.metadata[part.tool_call_id] = {"approval_id": approval_id}
        elif approval.status in ("rejected", "expired", "cancelled"):
            results.approvals[part.tool_call_id] = ToolDenied(
                f"A reviewer did not approve this call ({approval.status}). "
                "It was not executed.")
        else:
            waiting.append(Paused(approval_id=approval_id, review_url=meta.get("review_url"),
                                  tool=part.tool_name, args=part.args_as_dict(),
                                  decision_id=meta.get("decision_id")))
    return results, waiting
