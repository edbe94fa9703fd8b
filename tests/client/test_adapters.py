"""Framework adapters against a live Cosigner and the real framework packages, each agent
driven by a scripted model (tests/client/agent_apps.py): an allowed call runs once, a
denied call is refused to the model and never runs, a call needing approval pauses the
run, is approved through the API by a finance key, resumes and runs exactly once — and a
second resume of the same saved state does not run it again. OpenAI Agents and LangGraph
resume in a fresh process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.client import agent_apps
from tests.client.agent_apps import ACTORS, executions
from tests.client.conftest import REFUND, Live

ROOT = Path(__file__).resolve().parents[2]
ORDER = {"order_id": "ord_8472"}
TOO_MUCH = {**REFUND, "amount_minor": 250000}


@pytest.fixture
def tool_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "executions.jsonl"
    monkeypatch.setenv("COSIGNER_TOOL_LOG", str(path))
    return path


def fresh_process(*args: str) -> str:
    """Run ``tests.client.agent_apps`` in a new interpreter (this worktree's client)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "clients" / "python"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "tests.client.agent_apps", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


# ----------------------------------------------------------------- OpenAI Agents SDK

agents_sdk = pytest.importorskip("agents")


async def openai_run(live: Live, run: str, tool: str, args: dict[str, Any]) -> Any:
    from agents import Runner
    from cosigner_client import AsyncGate

    async with AsyncGate(live.url, live.runtime, run=run, **ACTORS) as gate:
        return await Runner.run(agent_apps.openai_agent(gate, tool, args), "go")


def test_openai_agents_allowed_call_runs_once(live: Live, tool_log: Path) -> None:
    result = asyncio.run(openai_run(live, run_id(), "get_order", ORDER))
    assert result.interruptions == []
    assert result.final_output == "model read: order ord_8472: 2 charges"
    assert executions(tool_log) == [{"tool": "get_order", "args": ORDER}]


def test_openai_agents_denied_call_is_refused_to_the_model(live: Live, tool_log: Path
                                                           ) -> None:
    result = asyncio.run(openai_run(live, run_id(), "issue_refund", TOO_MUCH))
    assert result.interruptions == []
    assert result.final_output.startswith("model read: Cosigner denied this call "
                                          "(over_hard_limit")
    assert executions(tool_log) == []


def test_openai_agents_approval_pauses_and_resumes_once_in_a_fresh_process(
        live: Live, tool_log: Path, tmp_path: Path) -> None:
    from cosigner_client import AsyncGate
    from cosigner_client.adapters.openai_agents import pending_approvals

    run = run_id()

    async def start() -> tuple[Any, list[Any]]:
        async with AsyncGate(live.url, live.runtime, run=run, **ACTORS) as gate:
            from agents import Runner

            result = await Runner.run(
                agent_apps.openai_agent(gate, "issue_refund", REFUND), "go")
            return result, await pending_approvals(gate, result.interruptions)

    result, paused = asyncio.run(start())
    assert len(result.interruptions) == 1 and len(paused) == 1
    approval = paused[0]
    assert approval.tool == "issue_refund" and approval.args == REFUND
    assert approval.review_url and approval.review_url.endswith(
        f"/ui/approvals/{approval.approval_id}")
    state_file = tmp_path / "state.json"
    state_file.write_text(result.to_state().to_string(), "utf-8")
    assert executions(tool_log) == []

    # Not approved yet: a resume leaves the run interrupted and runs nothing.
    still = asyncio.run(agent_apps.openai_resume(live.url, live.runtime, run,
                                                 str(state_file)))
    assert still == f"still waiting: {approval.approval_id}"
    assert executions(tool_log) == []

    args = ("openai", "resume", live.url, live.runtime, run, str(state_file))

    assert live.review(approval.approval_id).status_code == 200
    assert fresh_process(*args) == "model read: refunded 200000 USD on ord_8472"
    assert executions(tool_log) == [{"tool": "issue_refund", "args": REFUND}]

    # The same saved state resumed again: the permit is spent, the body does not run.
    again = fresh_process(*args)
    assert "already_redeemed" in again
    assert len(executions(tool_log)) == 1


def test_openai_agents_rejection_reaches_the_model(live: Live, tool_log: Path,
                                                  tmp_path: Path) -> None:
    from cosigner_client import AsyncGate
    from cosigner_client.adapters.openai_agents import apply_approvals, pending_approvals

    run = run_id()

    async def scenario() -> str:
        from agents import Runner

        async with AsyncGate(live.url, live.runtime, run=run, **ACTORS) as gate:
            agent = agent_apps.openai_agent(gate, "issue_refund", REFUND)
            result = await Runner.run(agent, "go")
            (paused,) = await pending_approvals(gate, result.interruptions)
            assert live.review(paused.approval_id, "rejected").status_code == 200
            state = result.to_state()
            assert await apply_approvals(gate, state) == []
            return str((await Runner.run(agent, state)).final_output)

    text = asyncio.run(scenario())
    assert text.startswith("model read: A reviewer did not approve this call (rejected)")
    assert executions(tool_log) == []


# ----------------------------------------------------------------- LangGraph

langgraph = pytest.importorskip("langgraph")


def langgraph_run(live: Live, run: str, tool: str, args: dict[str, Any], db: Path
                  ) -> dict[str, Any]:
    from cosigner_client import Gate
    from langchain_core.messages import HumanMessage

    with Gate(live.url, live.runtime, run=run, **ACTORS) as gate:
        graph = agent_apps.langgraph_app(gate, tool, args, str(db))
        out: dict[str, Any] = graph.invoke({"messages": [HumanMessage("go")]},
                                           {"configurable": {"thread_id": "t1"}})
        out["checkpoint_id"] = graph.get_state(
            {"configurable": {"thread_id": "t1"}}).config["configurable"]["checkpoint_id"]
        return out


def test_langgraph_allowed_call_runs_once(live: Live, tool_log: Path, tmp_path: Path
                                          ) -> None:
    out = langgraph_run(live, run_id(), "get_order", ORDER, tmp_path / "graph.db")
    assert "__interrupt__" not in out
    assert out["messages"][-1].content == "model read: order ord_8472: 2 charges"
    assert executions(tool_log) == [{"tool": "get_order", "args": ORDER}]


def test_langgraph_denied_call_is_refused_to_the_model(live: Live, tool_log: Path,
                                                       tmp_path: Path) -> None:
    out = langgraph_run(live, run_id(), "issue_refund", TOO_MUCH, tmp_path / "graph.db")
    assert "__interrupt__" not in out
    assert out["messages"][-2].status == "error"
    assert out["messages"][-1].content.startswith(
        "model read: Cosigner denied this call (over_hard_limit")
    assert executions(tool_log) == []


def test_langgraph_approval_interrupts_and_resumes_once_in_a_fresh_process(
        live: Live, tool_log: Path, tmp_path: Path) -> None:
    run, db = run_id(), tmp_path / "graph.db"
    out = langgraph_run(live, run, "issue_refund", REFUND, db)
    (pause,) = out["__interrupt__"]
    approval_id = pause.value["approval_id"]
    assert pause.value["tool"] == "issue_refund" and pause.value["args"] == REFUND
    assert pause.value["review_url"].endswith(f"/ui/approvals/{approval_id}")
    assert executions(tool_log) == []

    # Resumed before anyone approved: the node asks again, nothing runs.
    assert agent_apps.langgraph_resume(live.url, live.runtime, run, str(db), "t1") == (
        f"still waiting: {approval_id}")
    assert executions(tool_log) == []

    assert live.review(approval_id).status_code == 200
    args = ("langgraph", "resume", live.url, live.runtime, run, str(db), "t1")
    assert fresh_process(*args) == "model read: refunded 200000 USD on ord_8472"
    assert executions(tool_log) == [{"tool": "issue_refund", "args": REFUND}]

    # Resumed again from the interrupted checkpoint: the permit is spent.
    again = fresh_process(*args, out["checkpoint_id"])
    assert again.startswith("model read: The permit for this call was refused "
                            "(already_redeemed)")
    assert len(executions(tool_log)) == 1


# ----------------------------------------------------------------- @cosigned + result adapters


class ScriptedClaude:
    """A scripted Anthropic-style model: one ``tool_use`` block per turn, and a transcript
    of the ``tool_result`` blocks it was sent back."""

    def __init__(self, *calls: tuple[str, dict[str, Any]]) -> None:
        self.turns = [{"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": args}
                      for i, (name, args) in enumerate(calls)]
        self.seen: list[dict[str, Any]] = []

    def run(self, tools: dict[str, Any]) -> list[dict[str, Any]]:
        from cosigner_client import from_anthropic
        from cosigner_client.adapters.results import anthropic_tool_result

        for block in self.turns:
            call = from_anthropic(block)
            value = tools[call.name](**call.args)
            self.seen.append(anthropic_tool_result(str(call.id), value))
        return self.seen


def cosigned_tools(gate: Any, **options: Any) -> dict[str, Any]:
    from cosigner_client.adapters.decorator import cosigned

    return {name: cosigned(gate, **options)(fn) for name, fn in agent_apps.TOOLS.items()}


def test_decorator_allowed_and_denied_calls_reach_the_model(live: Live, tool_log: Path
                                                            ) -> None:
    from cosigner_client import Gate
    from cosigner_client.adapters.results import openai_tool_output

    model = ScriptedClaude(("get_order", ORDER), ("issue_refund", TOO_MUCH))
    with Gate(live.url, live.runtime, run=run_id(), **ACTORS) as gate:
        tools = cosigned_tools(gate)
        assert tools["get_order"].tool_name == "get_order"  # the function's name
        allowed, denied = model.run(tools)
        assert allowed == {"type": "tool_result", "tool_use_id": "toolu_0",
                           "content": "order ord_8472: 2 charges", "is_error": False}
        assert denied["is_error"] is True and denied["tool_use_id"] == "toolu_1"
        assert denied["content"].startswith("Cosigner denied this call (over_hard_limit")
        refused = tools["issue_refund"](**TOO_MUCH)
        assert openai_tool_output("call_9", refused) == {
            "type": "function_call_output", "call_id": "call_9", "output": str(refused)}
    assert executions(tool_log) == [{"tool": "get_order", "args": ORDER}]


def test_decorator_can_raise_on_refusal(live: Live, tool_log: Path) -> None:
    from cosigner_client import CallRefused, Gate

    with Gate(live.url, live.runtime, run=run_id(), **ACTORS) as gate:
        tools = cosigned_tools(gate, on_refusal="raise")
        with pytest.raises(CallRefused) as info:
            tools["issue_refund"](**TOO_MUCH)
    assert info.value.code == "over_hard_limit"
    assert executions(tool_log) == []


def test_decorator_pauses_and_resumes_from_the_approval_id_once(live: Live, tool_log: Path
                                                                ) -> None:
    from cosigner_client import Gate
    from cosigner_client.adapters.results import anthropic_tool_result
    from cosigner_client.pause import ApprovalPending, resume

    run = run_id()
    with Gate(live.url, live.runtime, run=run, **ACTORS) as gate:
        tools = cosigned_tools(gate, on_approval="pause")
        with pytest.raises(ApprovalPending) as info:
            tools["issue_refund"](**REFUND)
        paused = info.value.paused
        assert paused.review_url and paused.review_url.endswith(paused.approval_id)
        pending = tools["issue_refund"].resume(paused.approval_id)
        assert pending.code == "pending" and executions(tool_log) == []
    assert live.review(paused.approval_id).status_code == 200

    # Another gate (another process would do the same): the approval id is enough.
    with Gate(live.url, live.runtime, run=run, **ACTORS) as gate:
        other = {**REFUND, "amount_minor": 199999}
        mismatch = resume(gate, paused.approval_id, agent_apps.issue_refund, args=other)
        assert mismatch.status == "redeem_refused" and mismatch.code == "args_mismatch"
        tools = cosigned_tools(gate, on_approval="pause")
        done = tools["issue_refund"].resume(paused.approval_id)
        assert done == "refunded 200000 USD on ord_8472"
        again = resume(gate, paused.approval_id, agent_apps.issue_refund)  # tool, args: its own
        assert again.status == "redeem_refused" and again.code == "already_redeemed"
        second = tools["issue_refund"].resume(paused.approval_id)
        assert anthropic_tool_result("toolu_1", second)["is_error"] is True
    assert executions(tool_log) == [{"tool": "issue_refund", "args": REFUND}]


# ----------------------------------------------------------------- Pydantic AI


def pydantic_run(live: Live, run: str, tool: str, args: dict[str, Any]) -> Any:
    from cosigner_client import AsyncGate

    async def go() -> Any:
        async with AsyncGate(live.url, live.runtime, run=run, **ACTORS) as gate:
            return await agent_apps.pydantic_agent(gate, tool, args).run("go")

    return asyncio.run(go())


def test_pydantic_ai_allowed_call_runs_once(live: Live, tool_log: Path) -> None:
    pytest.importorskip("pydantic_ai")
    result = pydantic_run(live, run_id(), "get_order", ORDER)
    assert result.output == "model read: order ord_8472: 2 charges"
    assert executions(tool_log) == [{"tool": "get_order", "args": ORDER}]


def test_pydantic_ai_denied_call_is_refused_to_the_model(live: Live, tool_log: Path
                                                         ) -> None:
    pytest.importorskip("pydantic_ai")
    result = pydantic_run(live, run_id(), "issue_refund", TOO_MUCH)
    assert result.output.startswith("model read: Cosigner denied this call (over_hard_limit")
    assert executions(tool_log) == []


def test_pydantic_ai_deferred_approval_resolved_from_cosigner_runs_once(
        live: Live, tool_log: Path) -> None:
    pytest.importorskip("pydantic_ai")
    from cosigner_client import AsyncGate
    from cosigner_client.adapters.pydantic_ai import approval_results
    from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved

    run = run_id()

    async def scenario() -> None:
        async with AsyncGate(live.url, live.runtime, run=run, **ACTORS) as gate:
            agent = agent_apps.pydantic_agent(gate, "issue_refund", REFUND)
            first = await agent.run("go")
            assert isinstance(first.output, DeferredToolRequests)
            (part,) = first.output.approvals
            meta = first.output.metadata[part.tool_call_id]
            assert meta["review_url"].endswith(f"/ui/approvals/{meta['approval_id']}")
            history = first.all_messages()

            results, waiting = await approval_results(gate, first.output)
            assert [w.approval_id for w in waiting] == [meta["approval_id"]]
            # Approving in Pydantic AI alone carries no authority: nothing runs.
            forged = await agent.run(message_history=history, deferred_tool_results=(
                DeferredToolResults(approvals={part.tool_call_id: ToolApproved()})))
            assert forged.output.startswith("model read: This call is waiting for approval")
            assert executions(tool_log) == []

            assert live.review(meta["approval_id"]).status_code == 200
            results, waiting = await approval_results(gate, first.output)
            assert waiting == []
            done = await agent.run(message_history=history, deferred_tool_results=results)
            assert done.output == "model read: refunded 200000 USD on ord_8472"
            again = await agent.run(message_history=history, deferred_tool_results=results)
            assert again.output.startswith("model read: The permit for this call was refused "
                                           "(already_redeemed)")

    asyncio.run(scenario())
    assert executions(tool_log) == [{"tool": "issue_refund", "args": REFUND}]


def test_async_decorator_pauses_and_resumes_once(live: Live, tool_log: Path) -> None:
    from cosigner_client import AsyncGate
    from cosigner_client.adapters.decorator import cosigned
    from cosigner_client.pause import ApprovalPending

    ran: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with AsyncGate(live.url, live.runtime, run=run_id(), **ACTORS) as gate:
            @cosigned(gate, on_approval="pause")
            async def issue_refund(order_id: str, amount_minor: int, currency: str,
                                   reason_code: str) -> str:
                ran.append({"order_id": order_id, "amount_minor": amount_minor})
                return "refunded"

            denied = await issue_refund(**TOO_MUCH)
            assert denied.startswith("Cosigner denied this call (over_hard_limit")
            assert ran == []
            with pytest.raises(ApprovalPending) as info:
                await issue_refund(**REFUND)
            approval_id = info.value.paused.approval_id
            assert live.review(approval_id).status_code == 200
            assert await issue_refund.resume(approval_id) == "refunded"
            second = await issue_refund.resume(approval_id)
            assert second.code == "already_redeemed"

    asyncio.run(scenario())
    assert ran == [{"order_id": "ord_8472", "amount_minor": 200000}]
