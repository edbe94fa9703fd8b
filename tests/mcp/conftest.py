"""Fixtures for the MCP gate tests: a live Cosigner with the test's own bundles, the real
third-party servers (npm ``@modelcontextprotocol/server-filesystem`` installed here with
``npm ci``, PyPI ``mcp-server-time`` from the dev extra), and an ``mcp`` SDK client
session talking to ``cosigner-mcp-gate`` wrapped around them."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from cosigner.core.clock import system_clock
from cosigner.db.database import Database
from cosigner.identity.principals import create_api_key
from tests.conftest import ROOT, LiveServer, start_module_server

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
PRINCIPAL, INITIATOR = "dev-1", "agent-1"


@pytest.fixture(scope="session")
def filesystem_server() -> list[str]:
    """The command of the unmodified npm filesystem server (``npm ci`` on first use)."""
    entry = HERE / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist"
    if not (entry / "index.js").is_file():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is missing: run scripts/ensure-test-deps.sh (installs Node.js)")
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=HERE,
                       check=True, timeout=600)
    node = shutil.which("node")
    assert node is not None, "node is missing: run scripts/ensure-test-deps.sh"
    return [node, str(entry / "index.js")]


@pytest.fixture(scope="session")
def time_server() -> list[str]:
    exe = BIN / "mcp-server-time"
    assert exe.is_file(), "mcp-server-time is missing: pip install -e '.[dev]'"
    return [str(exe), "--local-timezone", "UTC"]


@dataclass
class Cosigner:
    url: str
    tenant: str
    runtime: str
    maintainer: str
    auditor: str

    def pending(self) -> list[dict[str, Any]]:
        resp = httpx.get(f"{self.url}/v1/approvals", params={"status": "pending"},
                         headers={"Authorization": f"Bearer {self.maintainer}"}, timeout=10)
        resp.raise_for_status()
        items: list[dict[str, Any]] = resp.json()["items"]
        return items

    def review(self, approval_id: str, decision: str = "approved") -> httpx.Response:
        return httpx.post(f"{self.url}/v1/approvals/{approval_id}/reviews",
                          headers={"Authorization": f"Bearer {self.maintainer}"},
                          json={"decision": decision, "comment": "looked at the diff"},
                          timeout=10)

    def events(self, type: str) -> list[dict[str, Any]]:
        """Decision-log events of this tenant of one type (auditor key)."""
        page = self.get("/v1/audit/events", self.auditor, type=type, limit=500)
        return list(page["events"])

    def outcomes(self) -> list[tuple[str, str, str]]:
        """(tool, outcome, side_effect) of every outcome report, in order."""
        return [(e["tool"], e["payload"]["outcome"], e["payload"]["side_effect"])
                for e in self.events("outcome.reported")]

    def get(self, path: str, key: str | None = None, **params: Any) -> Any:
        resp = httpx.get(f"{self.url}{path}", timeout=10, params=params,
                         headers={"Authorization": f"Bearer {key or self.runtime}"})
        resp.raise_for_status()
        return resp.json()


def make_keys(database_url: str, tenant: str) -> dict[str, str]:
    async def run() -> dict[str, str]:
        db = Database(database_url)
        try:
            keys = {}
            for name in ("runtime", "maintainer", "auditor"):
                keys[name], _ = await create_api_key(db, tenant=tenant, roles=[name],
                                                     subject=f"{name}-1", clock=system_clock)
            return keys
        finally:
            await db.dispose()
    return asyncio.run(run())


def filesystem_bundle(dest: Path, *, root: Path, tenant: str = "*") -> Path:
    """rego/mcp_filesystem as shipped, with its root set to ``root`` and its tenants."""
    bundle = dest / "mcp_filesystem"
    shutil.copytree(ROOT / "rego" / "mcp_filesystem", bundle)
    (bundle / "roots.rego").write_text(
        f'package cosigner.mcp_filesystem\n\nroots := {{{json.dumps(str(root))}}}\n')
    for name in ("manifest.toml", "cases.yaml"):
        text = (bundle / name).read_text()
        text = text.replace('tenants = ["mcp-demo"]', f'tenants = ["{tenant}"]')
        (bundle / name).write_text(text.replace("/srv/mcp", str(root)))
    return dest


@pytest.fixture(scope="module")
def module_server(db_kind: str, pg_url: str | None, sqlite_template: Path,
                  tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Callable[[Path], tuple[str, str]]]:
    """``module_server(bundle_dir)`` → ``(url, database_url)``: one ``cosigner serve`` per
    test module (starting one costs seconds) loading only ``bundle_dir``; tests stay
    apart by tenant."""
    servers: list[LiveServer] = []

    def start(bundle_dir: Path) -> tuple[str, str]:
        server, database_url = start_module_server(
            tmp_path_factory.mktemp("mcp-live"), db_kind=db_kind, pg_url=pg_url,
            sqlite_template=sqlite_template, bundle_dirs=[bundle_dir],
            COSIGNER_PUBLIC_URL="https://cosigner.example")
        servers.append(server)
        return server.url, database_url

    yield start
    for server in servers:
        server.stop()


def cosigner_for(shared: tuple[str, str], tenant: str) -> Cosigner:
    """The module's server with keys for this test's own tenant."""
    url, database_url = shared
    return Cosigner(url=url, tenant=tenant, **make_keys(database_url, tenant))


class Tap:
    """The lines ``tests/mcp/tap.py`` saw going to the server."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def command(self, server: list[str]) -> list[str]:
        return [sys.executable, str(HERE / "tap.py"), str(self.path), "--", *server]

    def messages(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def tool_calls(self) -> list[dict[str, Any]]:
        return [m["params"] for m in self.messages() if m.get("method") == "tools/call"]

    @property
    def server_pid(self) -> int:
        return int(Path(f"{self.path}.pid").read_text())


@pytest.fixture
def tap(tmp_path: Path) -> Tap:
    return Tap(tmp_path / "to-server.jsonl")


@asynccontextmanager
async def gate_session(url: str, key: str, server: list[str], *flags: str,
                       cwd: Path | None = None) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session with ``cosigner-mcp-gate ... -- server``."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
           "COSIGNER_TEST_KEY": key}
    params = StdioServerParameters(
        command=str(BIN / "cosigner-mcp-gate"),
        args=["--url", url, "--key-env", "COSIGNER_TEST_KEY", "--principal", PRINCIPAL,
              "--initiator", INITIATOR, *flags, "--", *server],
        env=env, cwd=cwd)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session
