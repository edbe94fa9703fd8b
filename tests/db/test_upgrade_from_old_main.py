"""A database made by the previous main (package ``server``, f23c8d0; four Alembic heads)
upgrades with ``cosigner migrate`` and serves its old decisions, approvals and permits.

The fixtures in ``tests/db/data`` were made by running the old server live (README.md
there); the test runs the real CLI and a real ``cosigner serve`` as subprocesses.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from cosigner.db.migrate import current_heads, script_heads
from tests.conftest import PG_BASE_URL, ROOT, LiveServer, _pg_admin, free_port

DATA = Path(__file__).resolve().parent / "data"
FIXTURE: dict[str, Any] = json.loads((DATA / "old_main.json").read_text())
OLD_HEADS = {"0002_approvals", "0003_audit", "0004_web", "0005_runs"}


def refund_body(request_id: str, amount: int, step: int) -> dict[str, Any]:
    """The decision bodies the fixture script sent (make_old_main_fixtures.refund)."""
    return {"request_id": request_id, "run": {"id": "run-legacy", "step": step},
            "principal": {"id": "customer-42", "type": "customer"},
            "initiator": {"id": "support-agent", "type": "agent"},
            "tool": {"name": "issue_refund", "side_effect": "financial"},
            "args": {"order_id": f"ord_{amount}", "amount_minor": amount,
                     "currency": "USD", "reason_code": "duplicate_charge"}}


OLD_BODIES = {"allow_kept": refund_body("legacy-allow-kept", 5000, 1),
              "allow_used": refund_body("legacy-allow-used", 6000, 2),
              "deny": refund_body("legacy-deny", 250000, 3),
              "require_approval": refund_body("legacy-approval", 150000, 4)}


def _load_pg_dump(url: str, dump: str) -> None:
    import asyncpg

    # pg_dump ≥ 15.14 wraps the script in psql meta-commands (\restrict); plain SQL only.
    sql = "\n".join(line for line in dump.splitlines() if not line.startswith("\\"))

    async def run() -> None:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


@pytest.fixture
def old_database(db_kind: str, tmp_path: Path) -> Any:
    """``(database_url, fixture record)``: a fresh copy of the old main's database."""
    record = FIXTURE[db_kind]
    if db_kind == "sqlite":
        path = tmp_path / "old.sqlite"
        shutil.copy(DATA / "old_main.sqlite", path)
        yield f"sqlite+aiosqlite:///{path}", record
        return
    name = f"cosigner_upgrade_{os.getpid()}"
    _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _pg_admin(f'CREATE DATABASE "{name}"')
    url = PG_BASE_URL.rsplit("/", 1)[0] + "/" + name
    try:
        _load_pg_dump(url, (DATA / "old_main_pg.sql").read_text())
        yield url, record
    finally:
        _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _env(database_url: str, tmp_path: Path) -> dict[str, str]:
    keys = tmp_path / "keys"
    if not keys.exists():  # the server may write to its key folder: use a copy
        shutil.copytree(DATA / "keys", keys)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSIGNER_")}
    env.update({"COSIGNER_DATABASE_URL": database_url, "COSIGNER_KEY_DIR": str(keys),
                "COSIGNER_BUNDLE_DIRS": json.dumps([str(DATA / "bundles")]),
                # the fixture's permits live ~50 years (bundles/refunds/rules.py)
                "COSIGNER_MAX_PERMIT_TTL_S": "1576800000",
                "COSIGNER_LOG_LEVEL": "warning"})
    return env


def cosigner(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cosigner", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_old_main_database_upgrades_and_serves_its_history(
        old_database: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    url, old = old_database
    env = _env(url, tmp_path)
    assert asyncio.run(current_heads(url)) == OLD_HEADS

    refused = cosigner(env, "serve", "--no-migrate", "--port", str(free_port()))
    assert refused.returncode == 1
    assert "cosigner migrate" in refused.stderr

    migrated = cosigner(env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert asyncio.run(current_heads(url)) == script_heads()

    server = LiveServer(env, free_port(), log_path=tmp_path / "server.log")
    server.start("--no-migrate")
    try:
        runtime = {"Authorization": f"Bearer {old['keys']['runtime']}"}
        auditor = {"Authorization": f"Bearer {old['keys']['auditor']}"}
        with httpx.Client(base_url=server.url, timeout=30) as http:
            # Old decisions: a replay of each request returns the stored decision.
            for name, body in OLD_BODIES.items():
                replay = http.post("/v1/decisions", json=body, headers=runtime)
                assert replay.status_code == 200, replay.text
                assert replay.json()["decision_id"] == old["decisions"][name]
                assert replay.json()["effect"] == old["effects"][name]
            made = http.get("/v1/audit/events", params={"type": "decision.made"},
                            headers=auditor)
            assert made.status_code == 200, made.text
            logged = {event["subject"]["decision_id"] for event in made.json()["events"]}
            assert logged == set(old["decisions"].values())

            # The old approval, approved by finance, with its permit.
            approval = http.get(f"/v1/approvals/{old['approval']['id']}", headers=runtime)
            assert approval.status_code == 200, approval.text
            assert approval.json()["status"] == "approved"
            assert approval.json()["permit"]["jti"] == old["approval"]["permit_jti"]

            # The unredeemed permit redeems once; the one redeemed before the upgrade is 409.
            def redeem(permit: dict[str, Any]) -> httpx.Response:
                return http.post("/v1/permits/redeem", headers=runtime, json={
                    "permit": permit["token"], "tool": "issue_refund",
                    "args": permit["args"]})

            first = redeem(old["permit_kept"])
            assert first.status_code == 200, first.text
            again = redeem(old["permit_kept"])
            assert again.status_code == 409 and again.json()["code"] == "already_redeemed"
            used = redeem(old["permit_used"])
            assert used.status_code == 409 and used.json()["code"] == "already_redeemed"

            jwks = tmp_path / "jwks.json"
            jwks.write_text(http.get("/.well-known/jwks.json").text)
    finally:
        server.stop()

    # The chain runs unbroken across the upgrade: old events, old checkpoint, new events,
    # a checkpoint signed by the new code.
    assert cosigner(env, "audit", "checkpoint", "--tenant", old["tenant"]).returncode == 0
    export = tmp_path / "log.jsonl"
    exported = cosigner(env, "audit", "export", "--tenant", old["tenant"], "--out", str(export))
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    types = [line["body"]["type"] for line in lines if line["kind"] == "event"]
    assert types.count("decision.made") == 4, types
    assert "approval.approved" in types and "permit.redeemed" in types
    assert sum(line["kind"] == "checkpoint" for line in lines) >= 2  # old and new
    verified = cosigner(env, "audit", "verify", str(export), "--jwks", str(jwks))
    assert verified.returncode == 0, verified.stdout + verified.stderr
