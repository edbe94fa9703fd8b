"""Shared fixtures: real SQLite files and the real PostgreSQL server, real HTTP.

Select the database with ``--db sqlite`` (default) or ``--db postgres``
(``COSIGNER_TEST_PG_URL``, default ``postgresql+asyncpg://postgres@127.0.0.1:5432/test``:
a fresh database ``cosigner_test_<pid>`` is created from it and dropped at the end).
Each test gets its own tenant id, so tests on one shared PostgreSQL database never see
each other's rows.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from cosigner.app import create_app
from cosigner.context import AppContext
from cosigner.core.clock import Clock
from cosigner.core.settings import Settings
from cosigner.db.database import Database
from cosigner.db.migrate import upgrade
from cosigner.identity.principals import create_api_key
from cosigner.tasks import Tasks

ROOT = Path(__file__).resolve().parent.parent
#: One key-encryption key for every server of the session: on PostgreSQL they all share
#: one database, hence one keyring (as replicas do).
TEST_KEK = "dGVzdC1rZXktZW5jcnlwdGlvbi1rZXktMzItYnl0ZXM"
PG_BASE_URL = os.environ.get("COSIGNER_TEST_PG_URL",
                             "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
#: How long a process the tests start (``cosigner serve``, the OpenID provider, OPA) may
#: take to answer: it only bounds a failure. 2 CPU s of imports took 32-53 s of wall time
#: at a load average of 18 on 2 cores (30 s was not enough there).
STARTUP_S = float(os.environ.get("COSIGNER_TEST_STARTUP_S", "180"))
#: Hypothesis's profile for the suite (no timing checks) and COSIGNER_HYPOTHESIS_SCALE.
pytest_plugins = ["tests.hypothesis_setup"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--db", default=os.environ.get("COSIGNER_TEST_DB", "sqlite"),
                     choices=["sqlite", "postgres"], help="database the tests run on")


@pytest.fixture(autouse=True)
def _shared_test_kek(monkeypatch: pytest.MonkeyPatch) -> None:
    """CLI commands run in-process read settings from the environment: the same KEK."""
    monkeypatch.setenv("COSIGNER_KEY_ENCRYPTION_KEY", TEST_KEK)


@pytest.fixture(scope="session")
def db_kind(pytestconfig: pytest.Config) -> str:
    return str(pytestconfig.getoption("--db"))


def _pg_admin(sql: str) -> None:
    import asyncpg

    async def run() -> None:
        dsn = PG_BASE_URL.replace("postgresql+asyncpg://", "postgresql://")
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


@pytest.fixture(scope="session")
def pg_url(db_kind: str) -> Iterator[str | None]:
    if db_kind != "postgres":
        yield None
        return
    name = f"cosigner_test_{os.getpid()}"
    _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _pg_admin(f'CREATE DATABASE "{name}"')
    url = PG_BASE_URL.rsplit("/", 1)[0] + "/" + name
    asyncio.run(upgrade(url))
    yield url
    _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "cosigner.db"
    asyncio.run(upgrade(f"sqlite+aiosqlite:///{path}"))
    return path


def migrated_database(folder: Path, db_kind: str, pg_url: str | None,
                      sqlite_template: Path) -> str:
    """The URL of a migrated database: a fresh copy of the SQLite template in ``folder``,
    or the session's shared PostgreSQL database."""
    if db_kind == "postgres":
        assert pg_url is not None
        return pg_url
    path = folder / "cosigner.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite+aiosqlite:///{path}"


@pytest.fixture
def database_url(db_kind: str, pg_url: str | None, sqlite_template: Path,
                 tmp_path: Path) -> str:
    """A migrated database for this test (a fresh SQLite file, or the shared PG db)."""
    return migrated_database(tmp_path, db_kind, pg_url, sqlite_template)


@pytest.fixture
def tenant() -> str:
    """A tenant id unique to this test."""
    return f"t-{uuid.uuid4().hex[:12]}"


def make_settings(database_url: str, tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "bundle_dirs": [ROOT / "policies", ROOT / "rego"],
        "key_dir": tmp_path / "keys",
        "key_encryption_key": TEST_KEK,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
def settings_factory(database_url: str, tmp_path: Path) -> Callable[..., Settings]:
    return lambda **overrides: make_settings(database_url, tmp_path, **overrides)


class Harness:
    """A running app (lifespan entered) with an HTTP client over ASGI."""

    def __init__(self, app: FastAPI, client: httpx.AsyncClient, settings: Settings) -> None:
        self.app = app
        self.client = client
        self.settings = settings

    @property
    def context(self) -> AppContext:
        ctx: AppContext = self.app.state.context
        return ctx

    @property
    def tasks(self) -> Tasks:
        tasks: Tasks = self.app.state.tasks
        return tasks

    @property
    def db(self) -> Database:
        return self.context.db

    def pin_rate_windows(self, at: float = 1_800_000_000.25) -> None:
        """Stop the clock of this app's rate-limit windows at ``at`` (seconds since the
        epoch; by default just after a minute starts, so every 1, 10 and 60 s window is
        fresh and has no window before it). A count then no longer depends on how long the
        test's requests take on a loaded machine (a window boundary crossed mid-test
        refills the sliding windows)."""
        self.context.quotas._windows._now = lambda: at

    async def key(self, tenant: str, *roles: str, subject: str | None = None) -> str:
        key, _ = await create_api_key(self.db, tenant=tenant, roles=list(roles),
                                      subject=subject, clock=self.context.clock)
        return key

    async def headers(self, tenant: str, *roles: str, subject: str | None = None
                      ) -> dict[str, str]:
        return {"Authorization": f"Bearer {await self.key(tenant, *roles, subject=subject)}"}


@pytest.fixture
async def harness_factory(settings_factory: Callable[..., Settings]
                          ) -> AsyncIterator[Callable[..., Any]]:
    """``await harness_factory(clock=..., **settings)`` → :class:`Harness`."""
    stack: list[Any] = []

    async def make(*, clock: Clock | None = None, **overrides: Any) -> Harness:
        settings = settings_factory(**overrides)
        app = create_app(settings, clock=clock)
        ctx = app.router.lifespan_context(app)
        await ctx.__aenter__()
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                   base_url="http://cosigner.test")
        stack.append((ctx, client))
        return Harness(app, client, settings)

    yield make
    for ctx, client in reversed(stack):
        await client.aclose()
        await ctx.__aexit__(None, None, None)


@pytest.fixture
async def harness(harness_factory: Callable[..., Any]) -> Harness:
    h: Harness = await harness_factory()
    return h


def decision_request(**overrides: Any) -> dict[str, Any]:
    """A valid DecisionRequest v1 body for the refund policy; override any field."""
    body: dict[str, Any] = {
        "request_id": f"req-{uuid.uuid4().hex}",
        "run": {"id": "run-1", "step": 1},
        "principal": {"id": "customer-42", "type": "customer"},
        "initiator": {"id": "agent-support", "type": "agent"},
        "tool": {"name": "issue_refund", "side_effect": "financial"},
        "args": {"order_id": "ord_8472", "amount_minor": 5000, "currency": "USD",
                 "reason_code": "duplicate_charge"},
        "context": {},
    }
    body.update(overrides)
    return body


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LiveServer:
    """A real ``cosigner serve`` process on a loopback port."""

    def __init__(self, env: dict[str, str], port: int, log_path: Path) -> None:
        self.env, self.port = env, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        # The server's log goes to a file: an undrained pipe fills up (64 KiB) under an
        # outage's error logging and then blocks the server's event loop on write.
        self.log_path = log_path

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def start(self, *extra: str) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cosigner", "serve", "--port", str(self.port),
                 *extra], env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited: " + self.log_tail())
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()  # not left running (and answering) after the test gave up on it
        raise RuntimeError(f"server did not start in {STARTUP_S} s: " + self.log_tail())

    def stop(self, sig: int | None = None) -> None:
        if self.proc is None:
            return
        if sig is None:
            self.proc.terminate()
        else:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def start_module_server(folder: Path, *, db_kind: str, pg_url: str | None,
                        sqlite_template: Path, bundle_dirs: list[Path],
                        args: tuple[str, ...] = (), **env: str) -> tuple[LiveServer, str]:
    """Start one ``cosigner serve`` for a test module (starting one costs seconds; tests
    stay apart by tenant): its database (``migrated_database``), keys and log in
    ``folder``, the given bundle folders, plus ``env`` (and ``serve`` options ``args``).
    Returns ``(server, database_url)``;
    the caller stops the server."""
    database_url = migrated_database(folder, db_kind, pg_url, sqlite_template)
    full = {**os.environ, "COSIGNER_DATABASE_URL": database_url,
            "COSIGNER_KEY_DIR": str(folder / "keys"),
            "COSIGNER_KEY_ENCRYPTION_KEY": TEST_KEK,
            "COSIGNER_BUNDLE_DIRS": json.dumps([str(path) for path in bundle_dirs]),
            "COSIGNER_LOG_LEVEL": "warning", **env}
    port = free_port()
    server = LiveServer(full, port, log_path=folder / f"server-{port}.log")
    server.start(*args)
    return server, database_url


@pytest.fixture
def live_server_factory(database_url: str, tmp_path: Path) -> Iterator[Callable[..., LiveServer]]:
    """``live_server_factory(**env)`` starts ``cosigner serve`` against this test's database."""
    servers: list[LiveServer] = []

    def make(**env: str) -> LiveServer:
        full = dict(os.environ)
        full.update({
            "COSIGNER_DATABASE_URL": database_url,
            "COSIGNER_KEY_DIR": str(tmp_path / "keys"),
            "COSIGNER_KEY_ENCRYPTION_KEY": TEST_KEK,
            "COSIGNER_BUNDLE_DIRS": f'["{ROOT / "policies"}", "{ROOT / "rego"}"]',
            "COSIGNER_LOG_LEVEL": "warning",
        })
        full.update(env)
        port = free_port()
        server = LiveServer(full, port, log_path=tmp_path / f"server-{port}.log")
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


#: Debian's Chromium, driven by Playwright in the browser tests (``-m browser``).
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per test module (scripts/ensure-test-deps.sh installs it)."""
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is missing: run scripts/ensure-test-deps.sh")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield launched
        launched.close()
