"""Issue 15, gap 8: following the README's instructions to change the MCP bundle's root
yields a bundle that passes its own cases and that a live server reloads."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ROOT, decision_request
from tests.e2e.helpers import make_keys

#: The README's command, with its example root.
SED = re.compile(r"^sed -i 's#/srv/mcp#(?P<root>[^#]+)#g' (?P<files>.+)$", re.MULTILINE)


def _readme_sed() -> tuple[str, str]:
    found = SED.search((ROOT / "README.md").read_text())
    assert found, "README no longer says how to change the MCP bundle's root"
    return found.group(0), found.group("root")


def _copy(dest: Path, tenant: str) -> Path:
    """rego/mcp_filesystem as shipped, under ``dest/rego``, serving ``tenant``."""
    bundle = dest / "rego" / "mcp_filesystem"
    shutil.copytree(ROOT / "rego" / "mcp_filesystem", bundle)
    manifest = bundle / "manifest.toml"
    manifest.write_text(manifest.read_text().replace('"mcp-demo"', f'"{tenant}"'))
    return bundle


def _policy_test(bundle: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``cosigner policy test`` of this worktree's code, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "cosigner", "policy", "test", str(bundle)],
                          cwd=ROOT, capture_output=True, text=True, env=env)


def _read(root: str) -> dict[str, Any]:
    return decision_request(tool={"name": "filesystem.read_text_file"},
                            args={"path": f"{root}/notes.txt"})


def test_readme_root_change_passes_the_cases_and_reloads(
    tmp_path: Path, live_server_factory: Any, database_url: str
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    bundle = _copy(tmp_path, tenant)
    server = live_server_factory(COSIGNER_BUNDLE_DIRS=json.dumps([str(bundle.parent)]))
    keys = asyncio.run(make_keys(database_url, tenant, {"r": (["runtime"], "agent")}))
    operator = asyncio.run(make_keys(database_url, "_system",
                                     {"op": (["operator"], f"op-{tenant}")}))["op"]
    command, example = _readme_sed()
    new_root = "/data/agent-files"
    # The README's first instruction alone (roots.rego) fails the bundle's own cases.
    only_roots = tmp_path / "only-roots"
    _copy(only_roots, tenant)
    subprocess.run(["sed", "-i", f"s#/srv/mcp#{new_root}#g", "rego/mcp_filesystem/roots.rego"],
                   cwd=only_roots, check=True)
    run = _policy_test(only_roots / "rego" / "mcp_filesystem", server.env)
    assert run.returncode == 1, run.stdout
    # The README's whole instruction: cases pass, the running server reloads it.
    subprocess.run(command.replace(example, new_root), shell=True, cwd=tmp_path, check=True)
    run = _policy_test(bundle, server.env)
    assert run.returncode == 0, run.stdout + run.stderr
    before = httpx.post(server.url + "/v1/decisions", json=_read(new_root), timeout=30,
                        headers={"Authorization": keys["r"]}).json()
    assert before["effect"] == "deny"  # the shipped root is still the active one
    reloaded = httpx.post(server.url + "/v1/policies/reload", timeout=120,
                          headers={"Authorization": operator})
    assert reloaded.status_code == 200, reloaded.text
    assert reloaded.json()["errors"] == [], reloaded.json()["errors"]
    after = httpx.post(server.url + "/v1/decisions", json=_read(new_root), timeout=30,
                       headers={"Authorization": keys["r"]}).json()
    assert after["effect"] == "allow", after
    assert after["policy"]["revision"] != before["policy"]["revision"]
