"""GET /v1/tools: the catalogue a runtime sees (what cosigner-mcp-gate --hide-denied uses)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import Harness


async def test_lists_the_tenants_catalogue_names_and_side_effects(harness: Harness) -> None:
    headers = await harness.headers("mcp-demo", "runtime")
    resp = await harness.client.get("/v1/tools", headers=headers)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["policy"]["id"] == "mcp-filesystem"
    tools = {t["name"]: t["side_effect"] for t in body["tools"]}
    assert tools["filesystem.read_text_file"] == "read"
    assert tools["filesystem.write_file"] == "write"
    assert all(set(t) == {"name", "side_effect"} for t in body["tools"])  # no schemas


async def test_other_tenants_see_their_own_bundle(harness: Harness, tenant: str) -> None:
    resp = await harness.client.get("/v1/tools", headers=await harness.headers(tenant, "runtime"))
    names = {t["name"] for t in resp.json()["tools"]}
    assert "get_order" in names and not any(n.startswith("filesystem.") for n in names)


async def test_no_catalogue_and_no_bundle_are_null(harness_factory: Callable[..., Any],
                                                   tmp_path: Path, tenant: str) -> None:
    bundle = tmp_path / "bundles" / "open"
    bundle.mkdir(parents=True)
    (bundle / "manifest.toml").write_text(
        'id = "open"\nversion = "1"\nengine = "python"\nentrypoint = "decide"\n'
        f'tenants = ["{tenant}"]\n')
    (bundle / "rules.py").write_text(
        "def decide(input):\n    return {'effect': 'deny', 'reasons': [{'code': 'no'}]}\n")
    h: Harness = await harness_factory(bundle_dirs=[tmp_path / "bundles"])
    own = await h.client.get("/v1/tools", headers=await h.headers(tenant, "runtime"))
    assert own.json()["tools"] is None and own.json()["policy"]["id"] == "open"
    other = await h.client.get("/v1/tools", headers=await h.headers("nobody", "runtime"))
    assert other.json() == {"policy": None, "tools": None}


async def test_needs_the_runtime_role(harness: Harness, tenant: str) -> None:
    resp = await harness.client.get("/v1/tools", headers=await harness.headers(tenant, "auditor"))
    assert resp.status_code == 403
    assert (await harness.client.get("/v1/tools")).status_code == 401
