"""What ``pip install cosigner`` gives an operator: a wheel with an SPDX license and the
starter bundle, ``cosigner init DIR`` making a bundle that tests and serves, a warning
(not silence) when ``serve`` finds no bundle, and no regopy import unless a Rego bundle is
loaded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path

import httpx

from cosigner.cli.init import STARTER_FILES
from tests.conftest import ROOT, TEST_KEK, LiveServer

REGOPY_PROBE = textwrap.dedent("""
    import asyncio, json, sys
    import httpx
    from cosigner.app import create_app
    from cosigner.core.settings import Settings

    async def main():
        settings = Settings(database_url=sys.argv[1], bundle_dirs=json.loads(sys.argv[2]),
                            key_dir=sys.argv[3], key_encryption_key=sys.argv[4])
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://t") as client:
                ready = await client.get("/readyz")
        print(json.dumps({"ready": ready.status_code, "regopy": "regopy" in sys.modules}))

    asyncio.run(main())
""")


def _probe(database_url: str, bundle_dirs: list[Path], tmp_path: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", REGOPY_PROBE, database_url,
         json.dumps([str(d) for d in bundle_dirs]), str(tmp_path / "keys"), TEST_KEK],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_python_rules_server_never_imports_regopy(database_url: str,
                                                    tmp_path: Path) -> None:
    assert _probe(database_url, [ROOT / "policies"], tmp_path) == {
        "ready": 200, "regopy": False}
    # The probe can tell: with a Rego bundle loaded, regopy is imported.
    assert _probe(database_url, [ROOT / "policies", ROOT / "rego"], tmp_path) == {
        "ready": 200, "regopy": True}


def _cosigner(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "cosigner", *args], cwd=cwd,
                          env=_env_with_source(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _env_with_source() -> dict[str, str]:
    import os

    return dict(os.environ, PYTHONPATH=str(ROOT))


def test_init_writes_a_starter_bundle_that_tests_and_serves(
        tmp_path: Path, live_server_factory: Callable[..., LiveServer],
        database_url: str) -> None:
    written = _cosigner("init", "bundles", cwd=tmp_path)
    assert "cosigner policy test bundles" in written.stderr
    assert sorted(p.name for p in (tmp_path / "bundles" / "starter").iterdir()) == sorted(
        STARTER_FILES)
    tested = _cosigner("policy", "test", "bundles", cwd=tmp_path)
    assert "3 passed, 0 failed" in tested.stdout
    again = subprocess.run([sys.executable, "-m", "cosigner", "init", "bundles"],
                           cwd=tmp_path, env=_env_with_source(), capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 1 and "exists" in again.stderr

    server = live_server_factory(
        COSIGNER_BUNDLE_DIRS=json.dumps([str(tmp_path / "bundles")]))
    key = _add_key(database_url)
    assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200
    effects = {}
    for tool, args in (("read_file", {"path": "notes.txt"}),
                       ("delete_customer", {"customer_id": "c1"})):
        resp = httpx.post(f"{server.url}/v1/decisions", timeout=10,
                          headers={"Authorization": f"Bearer {key}"},
                          json={"request_id": f"init-{tool}", "run": {"id": "run-1"},
                                "principal": {"id": "p"}, "initiator": {"id": "i"},
                                "tool": {"name": tool}, "args": args})
        assert resp.status_code == 200, resp.text
        effects[tool] = (resp.json()["effect"], resp.json()["policy"]["id"])
    assert effects == {"read_file": ("allow", "starter"),
                       "delete_customer": ("deny", "starter")}


def _add_key(database_url: str) -> str:
    from tests.cli.test_reads import add_keys

    return add_keys(database_url, ("starter-t", "runtime", None))[0]


def test_serve_with_no_bundle_warns_instead_of_denying_silently(
        tmp_path: Path, live_server_factory: Callable[..., LiveServer]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    server = live_server_factory(COSIGNER_BUNDLE_DIRS=json.dumps([str(empty)]))
    assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 503
    # The whole log: on the suite's shared PostgreSQL database, every other test's stored
    # bundle is one "not loaded here" line after the warning.
    log = server.log_tail(10_000_000)
    warnings = [line for line in log.splitlines() if f"no policy bundle found in {empty}" in line]
    assert warnings, log[-5000:]
    # JSON lines by default (`--log-format plain` prints "WARNING ..."): the level is there.
    assert '"level": "warning"' in warnings[0] or "WARNING" in warnings[0], warnings[0]
    assert "cosigner init DIR" in warnings[0]


def test_the_wheel_has_an_spdx_license_and_the_starter_bundle(tmp_path: Path) -> None:
    """Built from a copy of the source (a build writes build/ and egg-info beside it)."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "cosigner", source / "cosigner",
                    ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w",
                           str(tmp_path / "dist"), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "SetuptoolsDeprecationWarning" not in done.stdout + done.stderr
    wheel = next((tmp_path / "dist").glob("cosigner-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(next(n for n in names if n.endswith("/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    for name in STARTER_FILES:
        assert f"cosigner/cli/starter/{name}" in names
    migrations = {p.relative_to(ROOT).as_posix()
                  for p in (ROOT / "cosigner/db/migrations/versions").glob("*.py")}
    assert migrations and migrations <= names
    assert "cosigner/web/static/style.css" in names
