"""cosigner-mcp-gate over MCP Streamable HTTP, both sides: it fronts a real remote MCP
server speaking Streamable HTTP (``--upstream``; the official ``mcp`` SDK's server in
``http_notes_server.py``) and serves Streamable HTTP to its own clients (``--listen``),
with the stdio relay's gates, refusal results and review links."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import ROOT, free_port
from tests.mcp.conftest import INITIATOR, PRINCIPAL, Cosigner, cosigner_for
from tests.mcp.test_filesystem import text

pytestmark = pytest.mark.timeout(120)
HERE = Path(__file__).resolve().parent
CLIENT_SRC = ROOT / "clients" / "python"
RULES = """\
def decide(input):
    name = input['tool']['name']
    if name == 'notes.delete_notes':
        return {'effect': 'deny', 'reasons': [{'code': 'destructive_forbidden'}]}
    if name == 'notes.write_note':
        return {'effect': 'require_approval', 'reasons': [{'code': 'writes_need_review'}],
                'approval': {'require': [{'role': 'maintainer', 'count': 1}],
                             'timeout_ms': 60000, 'distinct_from': 'initiator'}}
    return {'effect': 'allow', 'reasons': [{'code': 'read_only'}]}
"""


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=0.5)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise AssertionError(f"{what} did not listen on {port}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def shared(module_server: Callable[[Path], tuple[str, str]],
           tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    bundles = tmp_path_factory.mktemp("bundles")
    bundle = bundles / "notes"
    bundle.mkdir()
    (bundle / "manifest.toml").write_text(
        'id = "notes-http"\nversion = "1"\nengine = "python"\nentrypoint = "decide"\n'
        'tenants = ["*"]\n')
    (bundle / "rules.py").write_text(RULES)
    return module_server(bundles)


@pytest.fixture(scope="module")
def cosigner(shared: tuple[str, str]) -> Cosigner:
    """One tenant for the module (gate processes are slow to start, so they are shared);
    tests tell their calls apart by their arguments."""
    return cosigner_for(shared, f"t-{uuid.uuid4().hex[:12]}")


class Upstream:
    """The remote MCP server (its own process, Streamable HTTP at /mcp)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc = subprocess.Popen([sys.executable, str(HERE / "http_notes_server.py"),
                                      str(self.port), str(log)])
        _wait_port(self.port, self.proc, "the MCP server")

    def calls(self, mark: str) -> list[dict[str, Any]]:
        """The calls the server ran whose arguments contain ``mark``."""
        if not self.log.exists():
            return []
        return [call for line in self.log.read_text().splitlines()
                if mark in json.dumps((call := json.loads(line))["args"])]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    server = Upstream(tmp_path_factory.mktemp("upstream") / "ran.jsonl")
    yield server
    _stop(server.proc)


def gate_command(cosigner: Cosigner, *flags: str) -> tuple[list[str], dict[str, str]]:
    """The gate from this checkout (``python -m cosigner_client.mcp_gate``)."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
           "PYTHONPATH": str(CLIENT_SRC), "COSIGNER_TEST_KEY": cosigner.runtime,
           "GATE_TOKEN": "s3cret-token"}
    return ([sys.executable, "-m", "cosigner_client.mcp_gate", "--url", cosigner.url,
             "--key-env", "COSIGNER_TEST_KEY", "--principal", PRINCIPAL, "--initiator",
             INITIATOR, "--server-name", "notes", "--progress-interval", "0.5", *flags], env)


@pytest.fixture(scope="module")
def http_gate(cosigner: Cosigner, upstream: Upstream) -> Iterator[str]:
    """``cosigner-mcp-gate --listen ... --upstream ...``; yields its /mcp URL."""
    port = free_port()
    command, env = gate_command(cosigner, "--listen", f"127.0.0.1:{port}",
                                "--listen-token-env", "GATE_TOKEN", "--upstream", upstream.url)
    proc = subprocess.Popen(command, env=env)
    _wait_port(port, proc, "cosigner-mcp-gate")
    yield f"http://127.0.0.1:{port}/mcp"
    _stop(proc)


@asynccontextmanager
async def http_session(url: str, token: str = "s3cret-token") -> AsyncIterator[ClientSession]:
    import httpx2  # the mcp SDK's HTTP client

    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                timeout=httpx2.Timeout(30, read=120))
    async with client, streamable_http_client(url, http_client=client) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def _approve_when_pending(cosigner: Cosigner, decision: str = "approved"
                                ) -> dict[str, Any]:
    for _ in range(400):
        pending = await asyncio.to_thread(cosigner.pending)
        if pending:
            resp = await asyncio.to_thread(cosigner.review, pending[0]["id"], decision)
            assert resp.status_code < 300, resp.text
            return pending[0]
        await asyncio.sleep(0.05)
    raise AssertionError("no approval request appeared")


async def test_http_client_http_server_allowed_denied_approved(
        cosigner: Cosigner, upstream: Upstream, http_gate: str) -> None:
    mark = uuid.uuid4().hex
    before = len(cosigner.outcomes())
    async with http_session(http_gate) as session:
        listed = await session.list_tools()
        assert {t.name for t in listed.tools} == {"read_note", "write_note", "delete_notes"}

        allowed = await session.call_tool("read_note", {"name": mark})
        assert not allowed.is_error, text(allowed)
        assert text(allowed) == f"note {mark}: hello"

        denied = await session.call_tool("delete_notes", {"pattern": mark})
        assert denied.is_error
        assert "destructive_forbidden" in text(denied)

        call = asyncio.create_task(session.call_tool("write_note", {"name": mark, "text": "b"}))
        approval = await _approve_when_pending(cosigner)
        approved = await call
        assert not approved.is_error, text(approved)
        assert text(approved) == f"wrote {mark}"
        assert approval["review_url"].startswith("https://cosigner.example/")

    # The remote server ran the allowed and the approved call once each, never the denied.
    assert upstream.calls(mark) == [{"tool": "read_note", "args": {"name": mark}},
                                    {"tool": "write_note", "args": {"name": mark, "text": "b"}}]
    assert cosigner.outcomes()[before:] == [("notes.read_note", "ok", "committed"),
                                            ("notes.write_note", "ok", "committed")]


async def test_rejected_approval_returns_the_review_link_and_never_runs(
        cosigner: Cosigner, upstream: Upstream, http_gate: str) -> None:
    mark = uuid.uuid4().hex
    async with http_session(http_gate) as session:
        call = asyncio.create_task(session.call_tool("write_note", {"name": mark, "text": "y"}))
        approval = await _approve_when_pending(cosigner, "rejected")
        refused = await call
    assert refused.is_error
    assert "rejected" in text(refused) and approval["review_url"] in text(refused)
    assert upstream.calls(mark) == []


async def test_sessions_are_separate_runs_and_the_listener_needs_its_token(
        cosigner: Cosigner, upstream: Upstream, http_gate: str) -> None:
    mark = uuid.uuid4().hex
    for _ in range(2):
        async with http_session(http_gate) as session:
            result = await session.call_tool("read_note", {"name": mark})
            assert not result.is_error, text(result)
    runs = [e["subject"]["run_id"] for e in cosigner.events("decision.made")
            if mark in json.dumps(e)]
    assert len(runs) == 2 and runs[0] != runs[1], runs
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        resp = httpx.post(http_gate, json=init, timeout=10, headers={
            "Accept": "application/json, text/event-stream", **headers})
        assert resp.status_code == 401
    # A first request that opens no session (not an initialize) leaves none behind.
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    resp = httpx.post(http_gate, json=ping, timeout=10, headers={
        "Accept": "application/json, text/event-stream", "Authorization": "Bearer s3cret-token"})
    assert resp.status_code == 400


async def test_stdio_client_remote_http_server(cosigner: Cosigner, upstream: Upstream) -> None:
    """``--upstream`` without ``--listen``: an MCP client on stdio, the server remote."""
    mark = uuid.uuid4().hex
    command, env = gate_command(cosigner, "--upstream", upstream.url)
    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        allowed = await session.call_tool("read_note", {"name": mark})
        denied = await session.call_tool("delete_notes", {"pattern": mark})
    assert not allowed.is_error and text(allowed) == f"note {mark}: hello"
    assert denied.is_error and "destructive_forbidden" in text(denied)
    assert upstream.calls(mark) == [{"tool": "read_note", "args": {"name": mark}}]


async def test_stdio_both_sides_unchanged(cosigner: Cosigner, time_server: list[str]) -> None:
    """The refactored entry point still relays a stdio child for a stdio client."""
    before = len(cosigner.outcomes())
    command, env = gate_command(cosigner, "--", *time_server)
    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("get_current_time", {"timezone": "UTC"})
    assert not result.is_error, text(result)
    assert json.loads(text(result))["timezone"] == "UTC"
    assert cosigner.outcomes()[before:] == [("notes.get_current_time", "ok", "committed")]


@pytest.mark.parametrize("argv", [
    [],                                                   # no server at all
    ["--upstream", "http://x/mcp", "--", "cat"],          # two servers
    ["--upstream", "file:///tmp/x"],                      # not http(s)
    ["--listen", "nohost", "--upstream", "http://x/mcp"],  # no port
    ["--listen-token-env", "GATE_TOKEN", "--upstream", "http://x/mcp"],  # token, no listener
    ["--listen", "0.0.0.0:8931", "--upstream", "http://x/mcp"],  # open to all, no token
])
def test_flags_need_exactly_one_server(argv: list[str]) -> None:
    from cosigner_client.mcp_gate.cli import config_from, parser

    args = parser().parse_args(["--url", "http://c", *argv])
    with pytest.raises(SystemExit) as exc:
        config_from(args, {"COSIGNER_KEY": "k", "GATE_TOKEN": "t"})
    assert exc.value.code == 2
