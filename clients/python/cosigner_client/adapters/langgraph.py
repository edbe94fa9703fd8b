"""LangGraph: a tool node that runs every proposed tool call through Cosigner and, on
``require_approval``, pauses the graph with LangGraph's own ``interrupt()``.

    node = cosigner_tool_node(gate, [issue_refund, get_order])
    builder.add_node("tools", node)                       # in place of ToolNode
    graph = builder.compile(checkpointer=SqliteSaver(conn))
    out = graph.invoke({"messages": [...]}, config)
    out["__interrupt__"][0].value   # {"approval_id", "review_url", "tool", "args", ...}
    ...                                                   # later, in any process:
    graph.invoke(Command(resume={"wait": 30}), config)    # wait up to 30 s for people

The interrupt carries the approval id and review URL. On ``Command(resume=...)`` the node
reads the approval from Cosigner (or long-polls it for ``{"wait": seconds}``): still pending
→ it interrupts again; approved → redeem the single-use permit and run the tool once;
rejected / expired / cancelled → a ``ToolMessage`` with ``status="error"`` the model reads.
The resume value itself carries no authority.

Each call is decided under a request id derived from (run, tool, the model's tool-call id),
so the node — which LangGraph re-executes from its start on resume, possibly in another
process — gets the first decision back instead of opening a new approval request. All
approvals are asked for before any tool runs, so re-execution never runs a tool twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, ToolCall, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.types import interrupt

from cosigner_client.gate import Gate
from cosigner_client.models import CallResult, Decision
from cosigner_client.pause import (
    Paused,
    check,
    read_approval,
    refusal_text,
    resume,
    run_decided,
    stable_request_id,
)

__all__ = ["cosigner_tool_node"]


def _as_tool(tool: BaseTool | Callable[..., Any]) -> BaseTool:
    return tool if isinstance(tool, BaseTool) else StructuredTool.from_function(tool)


def _runner(tool: BaseTool) -> Callable[..., Any]:
    def run(**kwargs: Any) -> Any:
        return tool.invoke(kwargs)
    return run


def _wait_of(answer: Any) -> float:
    if isinstance(answer, Mapping):
        wait = answer.get("wait", 0)
        if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 0:
            return float(wait)
    return 0.0


def cosigner_tool_node(gate: Gate, tools: Sequence[BaseTool | Callable[..., Any]], *,
                       messages_key: str = "messages",
                       side_effects: Mapping[str, str] | None = None
                       ) -> Callable[[Any], dict[str, list[ToolMessage]]]:
    """A graph node (a function of the state) for the tool calls of the last AI message.

    ``gate`` must have a run (``run=`` or ``start_run``): it scopes the request ids.
    ``side_effects`` maps a tool name to its class (``read`` ...) for outcome reports.
    """
    by_name = {t.name: t for t in map(_as_tool, tools)}
    classes = dict(side_effects or {})

    def node(state: Any) -> dict[str, list[ToolMessage]]:
        messages = state[messages_key] if isinstance(state, Mapping) else getattr(
            state, messages_key)
        last = messages[-1]
        calls = last.tool_calls if isinstance(last, AIMessage) else []
        run = gate.run
        if run is None:
            raise ValueError("the gate has no run: pass run= or call start_run() first")
        # 1. decide every call (replayed by request id when this node runs again)
        decided: list[tuple[ToolCall, Decision | None, Paused | None]] = []
        for call in calls:
            if call["name"] not in by_name:
                decided.append((call, None, None))
                continue
            rid = stable_request_id("langgraph", str(run["id"]), call["name"],
                                    str(call["id"]))
            decision, paused = check(gate, call["name"], dict(call["args"]), request_id=rid)
            decided.append((call, decision, paused))
        # 2. every approval settled before anything runs; pause again while pending
        for _call, _, paused in decided:
            while paused is not None:
                wait = _wait_of(interrupt(paused.as_dict()))
                approval = (gate.wait_for_approval(paused.approval_id, timeout=wait)
                            if wait else read_approval(gate, paused.approval_id))
                if approval.terminal:
                    break
        # 3. run what Cosigner permits, once
        out = []
        for call, decided_as, paused in decided:
            name, args = call["name"], dict(call["args"])
            if decided_as is None:
                out.append(ToolMessage(content=f"Unknown tool {name}.", name=name,
                                       tool_call_id=call["id"], status="error"))
                continue
            fn = _runner(by_name[name])
            result: CallResult
            if paused is not None:
                result = resume(gate, paused.approval_id, fn, tool=name, args=args,
                                side_effect=classes.get(name))
            else:
                result = run_decided(gate, decided_as, name, args, fn,
                                     side_effect=classes.get(name))
            if result.executed:
                out.append(ToolMessage(content=str(result.value), name=name,
                                       tool_call_id=call["id"]))
            else:
                out.append(ToolMessage(content=refusal_text(result), name=name,
                                       tool_call_id=call["id"], status="error"))
        return {messages_key: out}

    return node
