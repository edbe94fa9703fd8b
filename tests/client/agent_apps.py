"""Agents built with real frameworks and scripted models (no network, no LLM), used by
tests/client/test_adapters.py in the test process and in fresh processes (``python -m
tests.client.agent_apps <framework> <phase> ...``) to resume from saved state.

Every tool appends one line per execution to the file named by ``COSIGNER_TOOL_LOG``, so
"ran exactly once" is counted across processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ACTORS = {"principal": {"id": "customer-42", "type": "customer"},
          "initiator": {"id": "agent-support", "type": "agent"}}


def record(tool: str, args: dict[str, Any]) -> None:
    with open(os.environ["COSIGNER_TOOL_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"tool": tool, "args": args}) + "\n")


def executions(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def issue_refund(order_id: str, amount_minor: int, currency: str, reason_code: str) -> str:
    """Refund an order."""
    record("issue_refund", {"order_id": order_id, "amount_minor": amount_minor,
                            "currency": currency, "reason_code": reason_code})
    return f"refunded {amount_minor} {currency} on {order_id}"


def get_order(order_id: str) -> str:
    """Look up an order."""
    record("get_order", {"order_id": order_id})
    return f"order {order_id}: 2 charges"


TOOLS = {"issue_refund": issue_refund, "get_order": get_order}


# ----------------------------------------------------------------- OpenAI Agents SDK


def openai_scripted_model(tool: str, args: dict[str, Any]) -> Any:
    """An OpenAI Agents ``Model`` that proposes ``tool(args)``; once it has the tool's
    output, it says what it read."""
    from agents import set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    class ScriptedModel(Model):
        async def get_response(self, system_instructions: Any, input: Any, *a: Any,
                               **kw: Any) -> ModelResponse:
            items = input if isinstance(input, list) else []
            outputs = [i for i in items if isinstance(i, dict)
                       and i.get("type") == "function_call_output"]
            if outputs:
                text = f"model read: {outputs[-1]['output']}"
                out: Any = ResponseOutputMessage(
                    id="msg_1", role="assistant", status="completed", type="message",
                    content=[ResponseOutputText(annotations=[], text=text,
                                                type="output_text")])
            else:
                out = ResponseFunctionToolCall(
                    id="fc_1", call_id="call_1", name=tool, arguments=json.dumps(args),
                    type="function_call", status="completed")
            return ModelResponse(output=[out], usage=Usage(), response_id=None)

        def stream_response(self, *a: Any, **kw: Any) -> AsyncIterator[Any]:
            raise NotImplementedError

    set_tracing_disabled(True)
    return ScriptedModel()


def openai_agent(gate: Any, tool: str, args: dict[str, Any]) -> Any:
    from agents import Agent
    from cosigner_client.adapters.openai_agents import cosigned_tool

    return Agent(name="support", instructions="help", model=openai_scripted_model(tool, args),
                 tools=[cosigned_tool(gate, fn) for fn in TOOLS.values()])


async def openai_resume(url: str, key: str, run: str, state_file: str) -> str:
    from agents import Runner, RunState
    from cosigner_client import AsyncGate
    from cosigner_client.adapters.openai_agents import apply_approvals

    saved = Path(state_file).read_text("utf-8")
    async with AsyncGate(url, key, run=run, **ACTORS) as gate:
        agent = openai_agent(gate, "unused", {})
        state = await RunState.from_string(agent, saved)
        waiting = await apply_approvals(gate, state)
        if waiting:
            return f"still waiting: {waiting[0].approval_id}"
        result = await Runner.run(agent, state)
        return str(result.final_output)


# ----------------------------------------------------------------- LangGraph


def langgraph_scripted_model(tool: str, args: dict[str, Any]) -> Any:
    """A graph node standing for the model: proposes ``tool(args)``, then says what the
    tool message read."""
    from langchain_core.messages import AIMessage, ToolMessage

    def model(state: Any) -> Any:
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            return {"messages": [AIMessage(content=f"model read: {last.content}")]}
        return {"messages": [AIMessage(content="", tool_calls=[
            {"name": tool, "args": args, "id": "call_1", "type": "tool_call"}])]}

    return model


def langgraph_app(gate: Any, tool: str, args: dict[str, Any], db: str) -> Any:
    """model node (scripted) → Cosigner's tool node → model node, checkpointed in SQLite."""
    import sqlite3

    from cosigner_client.adapters.langgraph import cosigner_tool_node
    from langchain_core.messages import AIMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    model = langgraph_scripted_model(tool, args)

    def route(state: Any) -> Any:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", cosigner_tool_node(gate, list(TOOLS.values()),
                                                 side_effects={"get_order": "read"}))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", END])
    builder.add_edge("tools", "model")
    saver = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
    return builder.compile(checkpointer=saver)


def langgraph_resume(url: str, key: str, run: str, db: str, thread: str,
                     checkpoint: str = "") -> str:
    from cosigner_client import Gate
    from langgraph.types import Command

    with Gate(url, key, run=run, **ACTORS) as gate:
        graph = langgraph_app(gate, "unused", {}, db)
        configurable = {"thread_id": thread}
        if checkpoint:  # resume from this saved checkpoint (again)
            configurable["checkpoint_id"] = checkpoint
        out = graph.invoke(Command(resume={"wait": 1}), {"configurable": configurable})
        if out.get("__interrupt__"):
            return f"still waiting: {out['__interrupt__'][0].value['approval_id']}"
        return str(out["messages"][-1].content)


# ----------------------------------------------------------------- Pydantic AI


def pydantic_scripted_model(tool: str, args: dict[str, Any]) -> Any:
    """A ``FunctionModel`` that proposes ``tool(args)``, then says what the tool returned."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def script(messages: list[Any], info: AgentInfo) -> ModelResponse:
        returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(f"model read: {returned[-1].content}")])
        return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id="call_1")])

    return FunctionModel(script)


def pydantic_agent(gate: Any, tool: str, args: dict[str, Any]) -> Any:
    """An agent whose scripted ``FunctionModel`` proposes ``tool(args)`` and then says
    what the tool returned."""
    from cosigner_client.adapters.pydantic_ai import cosigned_tool
    from pydantic_ai import Agent
    from pydantic_ai.tools import DeferredToolRequests

    return Agent(pydantic_scripted_model(tool, args), output_type=[str, DeferredToolRequests],
                 tools=[cosigned_tool(gate, fn) for fn in TOOLS.values()])


# ----------------------------------------------------------------- entry point


def main(argv: list[str]) -> None:
    framework, phase, *rest = argv
    if (framework, phase) == ("openai", "resume"):
        print(asyncio.run(openai_resume(*rest)))
    elif (framework, phase) == ("langgraph", "resume"):
        print(langgraph_resume(*rest))
    else:
        raise SystemExit(f"unknown {framework} {phase}")


if __name__ == "__main__":
    main(sys.argv[1:])
