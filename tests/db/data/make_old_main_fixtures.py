"""Rebuild the upgrade fixtures in this folder by running the PREVIOUS main (package
``server``, commit f23c8d0) live, once on SQLite and once on PostgreSQL.

    git worktree add /tmp/oldmain f23c8d0
    python tests/db/data/make_old_main_fixtures.py /tmp/oldmain

Needs PostgreSQL on 127.0.0.1:5432 (user postgres, trust) and pg_dump. Writes
``old_main.sqlite``, ``old_main_pg.sql``, ``keys/`` and ``old_main.json`` (plaintext API
keys, ids and permit tokens the upgrade test uses). See README.md.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
TENANT = "legacy"
PERMIT_TTL_S = "1576800000"  # ~50 years, as in bundles/refunds/rules.py
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_NAME = "cosigner_oldmain_fixture"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def refund(request_id: str, amount: int, step: int) -> dict[str, Any]:
    return {"request_id": request_id, "run": {"id": "run-legacy", "step": step},
            "principal": {"id": "customer-42", "type": "customer"},
            "initiator": {"id": "support-agent", "type": "agent"},
            "tool": {"name": "issue_refund", "side_effect": "financial"},
            "args": {"order_id": f"ord_{amount}", "amount_minor": amount,
                     "currency": "USD", "reason_code": "duplicate_charge"}}


def old_cli(old: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=old, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def play(old: Path, database_url: str) -> dict[str, Any]:
    """Keys, decisions, an approval and permits made by the old code on ``database_url``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSIGNER_")}
    env.update({"COSIGNER_DATABASE_URL": database_url, "COSIGNER_KEY_DIR": str(HERE / "keys"),
                "COSIGNER_BUNDLE_DIRS": json.dumps([str(HERE / "bundles")]),
                "COSIGNER_MAX_PERMIT_TTL_S": PERMIT_TTL_S, "COSIGNER_LOG_LEVEL": "warning"})
    old_cli(old, env, "migrate")
    keys = {role: old_cli(old, env, "principals", "add-key", "--tenant", TENANT,
                          "--role", role, "--subject", f"legacy-{role}")
            for role in ("runtime", "finance", "auditor")}
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--port", str(port)],
                            cwd=old, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        runtime = {"Authorization": f"Bearer {keys['runtime']}"}
        finance = {"Authorization": f"Bearer {keys['finance']}"}
        with httpx.Client(base_url=base, timeout=30) as http:
            def decide(body: dict[str, Any]) -> dict[str, Any]:
                reply = http.post("/v1/decisions", json=body, headers=runtime)
                assert reply.status_code == 200, reply.text
                return dict(reply.json())

            kept_body = refund("legacy-allow-kept", 5000, 1)
            kept = decide(kept_body)
            used_body = refund("legacy-allow-used", 6000, 2)
            used = decide(used_body)
            redeemed = http.post("/v1/permits/redeem", headers=runtime, json={
                "permit": used["permit"]["token"], "tool": "issue_refund",
                "args": used_body["args"]})
            assert redeemed.status_code == 200, redeemed.text
            denied = decide(refund("legacy-deny", 250000, 3))
            pending = decide(refund("legacy-approval", 150000, 4))
            approval_id = pending["approval"]["id"]
            review = http.post(f"/v1/approvals/{approval_id}/reviews", headers=finance,
                               json={"decision": "approved", "comment": "double charge"})
            assert review.status_code < 300, review.text
            approval = http.get(f"/v1/approvals/{approval_id}", headers=runtime).json()
            assert approval["status"] == "approved", approval
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    old_cli(old, env, "audit", "checkpoint", "--tenant", TENANT)
    return {
        "tenant": TENANT, "keys": keys,
        "decisions": {"allow_kept": kept["decision_id"], "allow_used": used["decision_id"],
                      "deny": denied["decision_id"],
                      "require_approval": pending["decision_id"]},
        "effects": {"allow_kept": kept["effect"], "allow_used": used["effect"],
                    "deny": denied["effect"], "require_approval": pending["effect"]},
        "approval": {"id": approval_id, "permit_jti": approval["permit"]["jti"]},
        "permit_kept": {"token": kept["permit"]["token"], "jti": kept["permit"]["jti"],
                        "args": kept_body["args"]},
        "permit_used": {"token": used["permit"]["token"], "jti": used["permit"]["jti"],
                        "args": used_body["args"]},
    }


def pg_admin(sql: str) -> None:
    subprocess.run(["psql", PG_ADMIN, "-q", "-c", sql], check=True)


def main(old: Path) -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=old, capture_output=True,
                            text=True, check=True).stdout.strip()
    shutil.rmtree(HERE / "keys", ignore_errors=True)
    sqlite_path = HERE / "old_main.sqlite"
    sqlite_path.unlink(missing_ok=True)
    out: dict[str, Any] = {"commit": commit}
    out["sqlite"] = play(old, f"sqlite+aiosqlite:///{sqlite_path}")
    pg_admin(f'DROP DATABASE IF EXISTS "{PG_NAME}" WITH (FORCE)')
    pg_admin(f'CREATE DATABASE "{PG_NAME}"')
    try:
        out["postgres"] = play(
            old, f"postgresql+asyncpg://postgres@127.0.0.1:5432/{PG_NAME}")
        dump = subprocess.run(
            ["pg_dump", "--inserts", "--no-owner", "--no-privileges",
             f"postgresql://postgres@127.0.0.1:5432/{PG_NAME}"],
            capture_output=True, text=True, check=True).stdout
        (HERE / "old_main_pg.sql").write_text(dump)
    finally:
        pg_admin(f'DROP DATABASE IF EXISTS "{PG_NAME}" WITH (FORCE)')
    conn = sqlite3.connect(sqlite_path)  # small pages keep the committed file small
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute("PRAGMA page_size=512")
    conn.execute("VACUUM")
    conn.close()
    (HERE / "keys" / ".lock").unlink(missing_ok=True)
    (HERE / "old_main.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/oldmain").resolve())
