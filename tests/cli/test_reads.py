"""``cosigner principals list``, ``keys list`` and ``policy list`` through the real command
line, against the test's database: as tables and as ``--json``, never a secret."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cosigner.core.clock import system_clock
from cosigner.db.database import Database
from cosigner.identity.principals import create_api_key
from tests.conftest import ROOT, Harness


def cosigner(database_url: str, *args: str, bundle_dirs: list[Path] | None = None,
             tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COSIGNER_DATABASE_URL=database_url)
    if bundle_dirs is not None:
        env["COSIGNER_BUNDLE_DIRS"] = json.dumps([str(d) for d in bundle_dirs])
    if tmp is not None:
        env["COSIGNER_KEY_DIR"] = str(tmp / "keys")
        # The rotated key is published now and signs in an hour: "next" while we look.
        env["COSIGNER_KEY_ACTIVATION_DELAY_S"] = "3600"
    done = subprocess.run([sys.executable, "-m", "cosigner", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def add_keys(database_url: str, *specs: tuple[str, str, str | None]) -> list[str]:
    """API keys for ``(tenant, role, subject)``, made in-process (not what is tested)."""
    async def run() -> list[str]:
        db = Database(database_url)
        try:
            return [(await create_api_key(db, tenant=t, roles=[r], subject=s,
                                          clock=system_clock))[0] for t, r, s in specs]
        finally:
            await db.dispose()
    return asyncio.run(run())


def test_principals_list_shows_roles_and_key_ids_never_keys(database_url: str,
                                                           tenant: str) -> None:
    runtime, finance, _ = add_keys(database_url, (tenant, "runtime", "Runtime-1"),
                                   (tenant, "finance", "fiona"),
                                   (f"{tenant}-other", "auditor", None))
    listed = cosigner(database_url, "principals", "list", "--tenant", tenant, "--json")
    found = json.loads(listed.stdout)["principals"]
    assert [(p["subject"], p["roles"], p["kind"]) for p in found] == [
        ("fiona", ["finance"], "key"), ("runtime-1", ["runtime"], "key")]
    assert all(p["tenant"] == tenant and not p["disabled"] for p in found)
    assert [len(p["api_keys"]) for p in found] == [1, 1]
    key_ids = {p["api_keys"][0]["id"] for p in found}
    assert all(key_id in runtime + finance for key_id in key_ids)  # the public part
    table = cosigner(database_url, "principals", "list", "--tenant", tenant).stdout
    assert "TENANT" in table and "fiona" in table and "finance" in table
    for key in (runtime, finance):
        assert key not in listed.stdout + table
    everyone = json.loads(cosigner(database_url, "principals", "list", "--json").stdout)
    assert {p["tenant"] for p in everyone["principals"]} >= {tenant, f"{tenant}-other"}


def test_keys_list_tells_which_key_signs_and_which_is_next(database_url: str,
                                                          tmp_path: Path) -> None:
    rotated = cosigner(database_url, "keys", "rotate", tmp=tmp_path)
    new_kid = rotated.stdout.strip().splitlines()[0]
    listed = cosigner(database_url, "keys", "list", "--json", tmp=tmp_path)
    keys: list[dict[str, Any]] = json.loads(listed.stdout)["keys"]
    states = {k["kid"]: k["state"] for k in keys}
    assert states[new_kid] == "next"
    # One key signs; on the session's shared PostgreSQL database other tests' rotations
    # may have left further keys waiting to sign.
    assert "signing" in states.values()
    assert set(states.values()) <= {"signing", "next", "retired", "unpublished"}
    new = next(k for k in keys if k["kid"] == new_kid)
    assert new["private_key_stored"] and new["alg"] == "Ed25519"
    assert "private_sealed" not in listed.stdout
    table = cosigner(database_url, "keys", "list", tmp=tmp_path).stdout
    assert new_kid in table and "signing" in table


async def test_policy_list_shows_what_is_active_for_which_tenants(
        harness: Harness, database_url: str) -> None:
    """The server (harness) stored the policy state; the CLI reads what every replica
    serves."""
    dirs = [ROOT / "policies", ROOT / "rego"]
    done = cosigner(database_url, "policy", "list", "--json", bundle_dirs=dirs)
    document = json.loads(done.stdout)
    bundles = {b["id"]: b for b in document["bundles"]}
    assert bundles["refunds"]["active"] == "1.0.0"
    assert bundles["refunds"]["state"]["active_version"] == "1.0.0"
    assert bundles["refunds"]["versions"][0]["tenants"] == ["*"]
    assert bundles["refunds-rego"]["versions"][0]["tenants"] == ["rego-demo"]
    assert document["errors"] == []
    table = cosigner(database_url, "policy", "list", bundle_dirs=dirs).stdout
    lines = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    assert lines["refunds"][1:4] == ["1.0.0", "-", "*"]
    assert lines["refunds-rego"][3] == "rego-demo"


def test_policy_list_of_an_empty_folder_says_everything_is_denied(
        database_url: str, tmp_path: Path) -> None:
    done = cosigner(database_url, "policy", "list", bundle_dirs=[tmp_path])
    assert done.stdout == ""
    assert "no policy bundle" in done.stderr and "cosigner init" in done.stderr
