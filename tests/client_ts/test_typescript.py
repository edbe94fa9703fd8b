"""The TypeScript client's suite (``clients/typescript``, Node's built-in test runner)
against a live ``cosigner serve``: ``npm ci`` when needed, ``tsc`` (builds dist/ and
type-checks), then ``node --test`` with the server's URL and this tenant's keys in the
environment. Fails on a non-zero exit, a skipped test or no test, showing node's output."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cosigner.core.clock import system_clock
from cosigner.db.database import Database
from cosigner.identity.principals import create_api_key
from tests.conftest import ROOT, start_module_server

PKG = ROOT / "clients" / "typescript"

RULES = """\
def decide(input):
    name = input['tool']['name']
    if name == 'delete_everything':
        return {'effect': 'deny', 'reasons': [{'code': 'destructive_forbidden'}]}
    if name == 'wire_money':
        return {'effect': 'require_approval', 'reasons': [{'code': 'wire'}],
                'approval': {'require': [{'role': 'finance', 'count': 1}],
                             'timeout_ms': 60000, 'distinct_from': 'initiator'}}
    return {'effect': 'allow', 'reasons': [{'code': 'ok'}]}
"""


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: run scripts/ensure-test-deps.sh (installs Node.js)")
    return path


@pytest.fixture(scope="module")
def built() -> Path:
    """``npm ci`` (when the lock file is newer than the install) and ``tsc`` (builds
    dist/, type-checks src/)."""
    npm = _tool("npm")
    installed = PKG / "node_modules" / ".package-lock.json"
    if not installed.is_file() or installed.stat().st_mtime < (
            PKG / "package-lock.json").stat().st_mtime:
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=PKG,
                       check=True, timeout=600)
    tsc = subprocess.run([_tool("node"), "node_modules/typescript/bin/tsc", "-p", "."],
                         cwd=PKG, capture_output=True, text=True, timeout=300)
    assert tsc.returncode == 0, f"tsc failed:\n{tsc.stdout}\n{tsc.stderr}"
    return PKG


@pytest.fixture(scope="module")
def server(db_kind: str, pg_url: str | None, sqlite_template: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    folder = tmp_path_factory.mktemp("client-ts")
    bundle = folder / "bundles" / "ts_demo"
    bundle.mkdir(parents=True)
    (bundle / "manifest.toml").write_text(
        'id = "ts_demo"\nversion = "1"\nengine = "python"\nentrypoint = "decide"\n'
        'tenants = ["*"]\n')
    (bundle / "rules.py").write_text(RULES)
    live, database_url = start_module_server(
        folder, db_kind=db_kind, pg_url=pg_url, sqlite_template=sqlite_template,
        bundle_dirs=[folder / "bundles"], COSIGNER_PUBLIC_URL="https://cosigner.example")
    yield live.url, database_url
    live.stop()


def _keys(database_url: str, tenant: str) -> dict[str, str]:
    async def run() -> dict[str, str]:
        db = Database(database_url)
        try:
            keys = {}
            for name, role in (("runtime", "runtime"), ("approver", "finance")):
                keys[name], _ = await create_api_key(db, tenant=tenant, roles=[role],
                                                     subject=f"{name}-1", clock=system_clock)
            return keys
        finally:
            await db.dispose()
    return asyncio.run(run())


def run_node_tests(pkg: Path, url: str, database_url: str, files: list[str]) -> str:
    tenant = f"ts-{uuid.uuid4().hex[:8]}"
    keys = _keys(database_url, tenant)
    env = {**os.environ, "COSIGNER_URL": url, "COSIGNER_TENANT": tenant,
           "COSIGNER_RUNTIME_KEY": keys["runtime"], "COSIGNER_APPROVER_KEY": keys["approver"]}
    proc = subprocess.run([_tool("node"), "--test", "--test-reporter=tap", *files], cwd=pkg,
                          env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"node --test failed:\n{out[-20000:]}"
    passed = re.search(r"^# pass (\d+)$", out, re.M)
    skipped = re.search(r"^# skipped (\d+)$", out, re.M)
    assert passed and int(passed.group(1)) > 0, f"no test ran:\n{out[-5000:]}"
    assert skipped and skipped.group(1) == "0", f"tests skipped:\n{out[-5000:]}"
    return out


def test_typescript_client(built: Path, server: tuple[str, str]) -> None:
    """Golden vectors, strict parse, the gates against the live server, faults, offline
    verification (test/canonical.test.mjs, test/gate.test.mjs)."""
    url, database_url = server
    run_node_tests(built, url, database_url, ["test/canonical.test.mjs", "test/gate.test.mjs"])


def test_vercel_ai_sdk_adapter(built: Path, server: tuple[str, str]) -> None:
    """ai 6.x tools behind Cosigner with MockLanguageModelV3 (test/ai-sdk.test.mjs)."""
    url, database_url = server
    run_node_tests(built, url, database_url, ["test/ai-sdk.test.mjs"])


def test_openai_agents_js_adapter(built: Path, server: tuple[str, str]) -> None:
    """@openai/agents tools behind Cosigner with a scripted Model; the approval resumed in
    a fresh node process from the serialized RunState (test/agents.test.mjs)."""
    url, database_url = server
    run_node_tests(built, url, database_url, ["test/agents.test.mjs"])


def test_readme_examples(built: Path, server: tuple[str, str]) -> None:
    """clients/typescript/README.md's examples run as written (test/readme.test.mjs)."""
    url, database_url = server
    run_node_tests(built, url, database_url, ["test/readme.test.mjs"])


def test_failure_kinds_fail_directions_and_site_modes(built: Path,
                                                       server: tuple[str, str]) -> None:
    """Every failure kind from a real cause, fail directions deny/proceed/ask, site modes
    shadow (recorded, no permit) and off (no request) (test/failures.test.mjs)."""
    url, database_url = server
    run_node_tests(built, url, database_url, ["test/failures.test.mjs"])
