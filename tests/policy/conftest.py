"""Fixtures for policy tests: bundle folders written under ``tmp_path``, a stand-in OPA.

``opa_standin`` is a stand-in speaking OPA's REST Data API (``POST /v1/data/<path>``
with ``{"input": ...}``, answering ``{"result": ...}`` or ``{}``), served by the stdlib
``http.server`` on loopback in a thread. Each path's answer is scripted per test: a
JSON body, an HTTP status, a delay. ``opa_binary`` starts a real ``opa run --server``
when an ``opa`` binary is on PATH (tests using it skip otherwise).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cosigner.policy.rego_engine import RegoEngine
from tests.conftest import STARTUP_S

ROOT = Path(__file__).resolve().parents[2]
REFUNDS_PY = ROOT / "policies" / "refunds"
REFUNDS_REGO = ROOT / "rego" / "refunds"


def write_bundle(root: Path, name: str, files: dict[str, str]) -> Path:
    """Write a bundle folder ``root/name`` with ``files`` (relative path → text)."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (folder / rel).write_text(text)
    return folder


def manifest(
    *,
    id: str,
    version: str = "1.0.0",
    engine: str = "rego",
    entrypoint: str = "data.cosigner.test.decision",
    tenants: str = '["*"]',
    extra: str = "",
) -> str:
    return (
        f'id = "{id}"\nversion = "{version}"\nengine = "{engine}"\n'
        f'entrypoint = "{entrypoint}"\ntenants = {tenants}\n{extra}'
    )


def rego_engine(source: str, entrypoint: str = "data.cosigner.test.decision") -> RegoEngine:
    return RegoEngine.from_files(
        {"policy.rego": source.encode()}, entrypoint=entrypoint, where="test"
    )


@dataclass
class Script:
    status: int = 200
    body: Any = field(default_factory=dict)
    raw: bytes | None = None
    delay_s: float = 0.0


class OpaStandin:
    """Scripted answers per data path; records the requests it received.

    Like OPA, a query with ``?provenance=true`` is answered with ``provenance``: the build
    facts, plus ``bundles: {name: {"revision": ...}}`` when :attr:`bundles` is set (OPA
    lists the bundles it activated; policies loaded from files or the Policy API have none).
    """

    def __init__(self) -> None:
        self.scripts: dict[str, Script] = {}
        self.requests: list[tuple[str, Any]] = []
        self.bundles: dict[str, dict[str, Any]] | None = None
        self.queries: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                path, _, query = self.path.removeprefix("/v1/data/").partition("?")
                standin.requests.append((path, body))
                standin.queries.append(query)
                script = standin.scripts.get(path, Script())
                if script.delay_s:
                    time.sleep(script.delay_s)
                answer = script.body
                if "provenance=true" in query and isinstance(answer, dict):
                    provenance: dict[str, Any] = {
                        "version": "1.4.2", "build_commit": "standin",
                        "build_timestamp": "2026-01-01T00:00:00Z", "build_hostname": "standin"}
                    if standin.bundles is not None:
                        provenance["bundles"] = standin.bundles
                    answer = {**answer, "provenance": provenance}
                payload = script.raw if script.raw is not None else json.dumps(answer).encode()
                try:
                    self.send_response(script.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout tests)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture
def opa_standin() -> Iterator[OpaStandin]:
    standin = OpaStandin()
    standin.thread.start()
    try:
        yield standin
    finally:
        standin.server.shutdown()
        standin.server.server_close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def opa_binary(tmp_path: Path) -> Iterator[str]:
    """URL of a real OPA server loaded with rego/refunds and tests' shape policies."""
    opa = shutil.which("opa")
    if opa is None:
        pytest.skip("no opa binary on PATH")
    (tmp_path / "shapes.rego").write_text(SHAPES_REGO)
    port = free_port()
    proc = subprocess.Popen(
        [
            opa,
            "run",
            "--server",
            "--addr",
            f"127.0.0.1:{port}",
            str(REFUNDS_REGO / "refunds.rego"),
            str(tmp_path / "shapes.rego"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None, "opa exited"
                assert time.monotonic() < deadline, f"opa did not listen in {STARTUP_S} s"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# Rules yielding each wrong result shape, for a real OPA (K05).
SHAPES_REGO = """package shapes

allowed_true := {"allowed": true}
string_true := "true"
one := 1
null_value := null
empty_list := []
"""
