"""cosigner-mcp-gate around the real, unmodified PyPI ``mcp-server-time``: allowed calls,
tools hidden by the catalogue, the server crashing, and Cosigner being down."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from tests.conftest import free_port
from tests.mcp.conftest import Cosigner, Tap, cosigner_for, gate_session
from tests.mcp.test_filesystem import text

pytestmark = pytest.mark.timeout(120)
GATE = ("--server-name", "time", "--progress-interval", "0.5")
TROLL = {"timezone": "Antarctica/Troll"}  # needs a maintainer in this test's policy


@pytest.fixture(scope="module")
def shared(module_server: Callable[[Path], tuple[str, str]],
           tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    bundles = tmp_path_factory.mktemp("bundles")
    bundle = bundles / "time"
    bundle.mkdir()
    (bundle / "manifest.toml").write_text(
        'id = "time-test"\nversion = "1"\nengine = "python"\nentrypoint = "decide"\n'
        'tenants = ["*"]\ncatalogue = "tools.yaml"\n')
    (bundle / "tools.yaml").write_text(json.dumps({"tools": {"time.get_current_time": {
        "side_effect": "read", "schema": {
            "type": "object", "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"], "additionalProperties": False}}}}))
    (bundle / "rules.py").write_text(
        "def decide(input):\n"
        "    if input['args'].get('timezone') == 'Antarctica/Troll':\n"
        "        return {'effect': 'require_approval', 'reasons': [{'code': 'remote'}],\n"
        "                'approval': {'require': [{'role': 'maintainer', 'count': 1}],\n"
        "                             'timeout_ms': 60000, 'distinct_from': 'initiator'}}\n"
        "    return {'effect': 'allow', 'reasons': [{'code': 'clock'}]}\n")
    return module_server(bundles)


@pytest.fixture
def cosigner(shared: tuple[str, str], tenant: str) -> Cosigner:
    return cosigner_for(shared, tenant)


async def test_allowed_call_returns_the_servers_answer(cosigner: Cosigner,
                                                       time_server: list[str], tap: Tap
                                                       ) -> None:
    async with gate_session(cosigner.url, cosigner.runtime, tap.command(time_server),
                            *GATE) as session:
        result = await session.call_tool("get_current_time", {"timezone": "UTC"})
    assert not result.is_error, text(result)
    answer = json.loads(text(result))
    assert answer["timezone"] == "UTC" and answer["datetime"][:4] == time.strftime("%Y")
    assert tap.tool_calls() == [{"name": "get_current_time", "arguments": {"timezone": "UTC"}}]
    assert cosigner.outcomes() == [("time.get_current_time", "ok", "committed")]


async def test_one_run_per_gate_session_with_the_gates_own_identities(
        cosigner: Cosigner, time_server: list[str]) -> None:
    for _ in range(2):
        async with gate_session(cosigner.url, cosigner.runtime, time_server, *GATE) as session:
            for zone in ("UTC", "Europe/Oslo"):
                result = await session.call_tool("get_current_time", {"timezone": zone})
                assert not result.is_error, text(result)
    made = cosigner.events("decision.made")
    runs = [e["subject"]["run_id"] for e in made]
    assert len(made) == 4 and runs[0] == runs[1] != runs[2] == runs[3]
    assert all(run.startswith("mcp-") for run in runs)
    assert {e["tool"] for e in made} == {"time.get_current_time"}
    assert [e["payload"]["run"]["step"] for e in made] == [1, 2, 1, 2]
    assert {(e["payload"]["principal"]["id"], e["payload"]["initiator"]["id"])
            for e in made} == {("dev-1", "agent-1")}


async def test_hide_denied_drops_tools_missing_from_the_catalogue(
        cosigner: Cosigner, time_server: list[str], tap: Tap) -> None:
    server = tap.command(time_server)
    async with gate_session(cosigner.url, cosigner.runtime, server, *GATE) as session:
        assert {t.name for t in (await session.list_tools()).tools} == {
            "get_current_time", "convert_time"}
    async with gate_session(cosigner.url, cosigner.runtime, server, *GATE,
                            "--hide-denied") as session:
        assert [t.name for t in (await session.list_tools()).tools] == ["get_current_time"]
        # Hidden is not the gate: a call by name is still decided, and denied.
        result = await session.call_tool("convert_time", {
            "source_timezone": "UTC", "time": "12:00", "target_timezone": "Europe/Oslo"})
    assert result.is_error and "unknown_tool" in text(result)
    assert tap.tool_calls() == []


async def test_gate_survives_the_server_crashing(cosigner: Cosigner, time_server: list[str],
                                                 tap: Tap) -> None:
    async with gate_session(cosigner.url, cosigner.runtime, tap.command(time_server),
                            *GATE) as session:
        ok = await session.call_tool("get_current_time", {"timezone": "UTC"})
        assert not ok.is_error, text(ok)
        os.kill(tap.server_pid, signal.SIGKILL)
        await _until_noticed(session)
        for _ in range(3):  # the gate keeps answering, every time as a tool error
            result = await session.call_tool("get_current_time", {"timezone": "UTC"})
            assert result.is_error and "not running" in text(result), text(result)
            assert result.meta is not None
            assert result.meta["cosigner"]["code"] == "server_unavailable"
        with pytest.raises(MCPError, match="MCP server"):  # other requests: JSON-RPC errors
            await session.list_tools()
    assert len(tap.tool_calls()) == 1
    assert len(cosigner.events("decision.made")) == 1  # refused before Cosigner was asked
    assert cosigner.outcomes() == [("time.get_current_time", "ok", "committed")]


async def test_server_crash_while_waiting_for_approval_runs_nothing(
        cosigner: Cosigner, time_server: list[str], tap: Tap) -> None:
    async def approve_after_crash() -> None:
        for _ in range(200):
            items = await asyncio.to_thread(cosigner.pending)
            if items:
                os.kill(tap.server_pid, signal.SIGKILL)
                await asyncio.sleep(0.5)
                await asyncio.to_thread(cosigner.review, items[0]["id"])
                return
            await asyncio.sleep(0.1)

    async with gate_session(cosigner.url, cosigner.runtime, tap.command(time_server),
                            *GATE) as session:
        approver = asyncio.create_task(approve_after_crash())
        result = await session.call_tool("get_current_time", TROLL)
        await approver
    assert result.is_error and "not running" in text(result), text(result)
    assert tap.tool_calls() == []
    # Approved and redeemed, but never run: reported as such.
    assert cosigner.outcomes() == [("time.get_current_time", "error", "not_executed")]


async def test_cosigner_down_is_a_tool_error_and_the_server_is_never_called(
        cosigner: Cosigner, time_server: list[str], tap: Tap) -> None:
    nothing = f"http://127.0.0.1:{free_port()}"  # no Cosigner listens here
    async with gate_session(nothing, cosigner.runtime, tap.command(time_server),
                            *GATE, "--timeout", "1") as session:
        started = time.monotonic()
        result = await session.call_tool("get_current_time", {"timezone": "UTC"})
        took = time.monotonic() - started
    assert result.is_error and "fail closed" in text(result) and "unavailable" in text(result)
    assert took < 5
    assert tap.tool_calls() == []


async def _until_noticed(session: Any) -> None:
    """Ping (relayed to the server) until the gate answers that the server is gone."""
    for _ in range(100):
        try:
            await session.send_ping()
        except MCPError:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the gate never noticed the crash")
