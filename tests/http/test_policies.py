"""Policy administration over HTTP (tenant admins and system operators), and the
`cosigner policy` CLI.

Golden refund cases go through POST /v1/decisions on both engines: tenant ``rego-demo``
is served by ``rego/refunds`` (embedded Rego), every other tenant by ``policies/refunds``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.cli.policy import run_test
from cosigner.core.settings import Settings
from cosigner.db.tables import audit_events
from cosigner.policy.cases import load_cases
from tests.conftest import ROOT, Harness, decision_request

GOOD = 'package cosigner.test\n\ndecision := {"effect": "allow", "reasons": ["v1"]}\n'
V2 = 'package cosigner.test\n\ndecision := {"effect": "deny", "reasons": ["v2"]}\n'
BROKEN = 'package cosigner.test\n\ndecision := {"effect": "allow" if {\n'


def write_rego(root: Path, folder: str, version: str, source: str, *, bundle_id: str = "b",
               tenants: str = '"*"') -> None:
    """A Rego bundle version. Tests on the shared PostgreSQL database give each bundle
    an id of its own: the stored policy state of a bundle id outlives the test."""
    path = root / folder
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.toml").write_text(
        f'id = "{bundle_id}"\nversion = "{version}"\nengine = "rego"\n'
        f'entrypoint = "data.cosigner.test.decision"\ntenants = [{tenants}]\n'
    )
    (path / "policy.rego").write_text(source)


async def operator(h: Harness) -> dict[str, str]:
    """Headers of a system operator (role ``operator`` in ``_system``)."""
    return await h.headers("_system", "operator")


async def decide(h: Harness, headers: dict[str, str], **overrides: Any) -> Any:
    resp = await h.client.post("/v1/decisions", headers=headers, json=decision_request(**overrides))
    return resp


async def event_types(h: Harness, tenant: str) -> list[str]:
    async with h.db.read() as conn:
        return list(
            (
                await conn.execute(
                    select(audit_events.c.type)
                    .where(audit_events.c.tenant == tenant)
                    .order_by(audit_events.c.seq)
                )
            ).scalars()
        )


async def test_golden_cases_give_identical_answers_on_both_engines(
    harness: Harness, tenant: str
) -> None:
    answers: dict[str, list[tuple[int, str | None]]] = {}
    for who in (tenant, "rego-demo"):
        headers = await harness.headers(who, "runtime")
        got = []
        for case in load_cases((ROOT / "policies/refunds/cases.yaml").read_bytes(), where="c"):
            resp = await decide(harness, headers, tool=case.input["tool"], args=case.input["args"])
            body = resp.json()
            got.append((resp.status_code, body.get("effect") or body.get("code")))
            want = {"deny": {"deny", "invalid_args", "unknown_tool"}}.get(
                case.effect, {case.effect}
            )
            assert (body.get("effect") or body.get("code")) in want, case.description
            if resp.status_code == 200:
                assert body["policy"]["id"] == ("refunds-rego" if who == "rego-demo" else "refunds")
        answers[who] = got
    assert answers[tenant] == answers["rego-demo"]


async def test_listing_needs_the_admin_role(harness: Harness, tenant: str) -> None:
    resp = await harness.client.get(
        "/v1/policies", headers=await harness.headers(tenant, "runtime")
    )
    assert resp.status_code == 403
    resp = await harness.client.get("/v1/policies", headers=await operator(harness))
    assert resp.status_code == 200
    bundles = {b["id"]: b for b in resp.json()["bundles"]}
    assert bundles["refunds-rego"]["active"] == "1.0.0"
    assert bundles["refunds-rego"]["versions"][0]["engine"] == "rego"
    assert bundles["refunds-rego"]["versions"][0]["path"].endswith("rego/refunds")
    assert bundles["refunds"]["versions"][0]["revision"].startswith("sha256:")
    assert resp.json()["errors"] == []


async def test_listing_shows_a_tenant_admin_only_its_bundles_without_paths(
    harness: Harness, tenant: str
) -> None:
    # Fault 2: every admin saw every bundle, other tenants' names and the server's paths.
    resp = await harness.client.get("/v1/policies", headers=await harness.headers(tenant, "admin"))
    assert resp.status_code == 200
    bundles = {b["id"]: b for b in resp.json()["bundles"]}
    assert set(bundles) == {"refunds"}  # the "*" bundle that decides for this tenant
    assert bundles["refunds"]["administered_by"] == "operator"
    assert "path" not in bundles["refunds"]["versions"][0]
    assert "rego-demo" not in resp.text and "mcp-demo" not in resp.text
    demo = await harness.client.get(
        "/v1/policies", headers=await harness.headers("rego-demo", "admin"))
    assert {b["id"] for b in demo.json()["bundles"]} == {"refunds-rego"}


async def test_reload_refuses_malformed_rego_and_the_old_version_keeps_serving(
    harness_factory: Any, tenant: str, tmp_path: Path
) -> None:
    root = tmp_path / "bundles"
    bundle_id = f"b-{tenant}"
    write_rego(root, "b1", "1.0.0", GOOD, bundle_id=bundle_id)
    h: Harness = await harness_factory(bundle_dirs=[root])
    admin = await h.headers(tenant, "admin")
    runtime = await h.headers(tenant, "runtime")
    write_rego(root, "b2", "2.0.0", BROKEN, bundle_id=bundle_id)
    resp = await h.client.post("/v1/policies/reload", headers=admin)  # reload: operators only
    assert (resp.status_code, resp.json()["code"]) == (403, "not_policy_admin")
    resp = await h.client.post("/v1/policies/reload", headers=await operator(h))
    assert resp.status_code == 200
    errors = resp.json()["errors"]
    assert len(errors) == 1 and "policy.rego:3:" in errors[0]["message"]
    assert resp.json()["bundles"][0]["active"] == "1.0.0"
    decision = (await decide(h, runtime)).json()
    assert (decision["effect"], decision["reasons"][0]["code"]) == ("allow", "v1")
    assert "policy.refused" in await event_types(h, tenant)


async def test_activate_and_shadow_are_logged_and_disagreements_reported(
    harness_factory: Any, tenant: str, tmp_path: Path
) -> None:
    root = tmp_path / "bundles"
    b = f"b-{tenant}"  # serves only this tenant: its admins administer it
    write_rego(root, "b1", "1.0.0", GOOD, bundle_id=b, tenants=f'"{tenant}"')
    write_rego(root, "b2", "2.0.0", V2, bundle_id=b, tenants=f'"{tenant}"')
    h: Harness = await harness_factory(bundle_dirs=[root])
    admin = await h.headers(tenant, "admin")
    runtime = await h.headers(tenant, "runtime")
    assert (await decide(h, runtime)).json()["effect"] == "deny"  # 2.0.0 is active

    resp = await h.client.post(
        f"/v1/policies/{b}/activate", headers=admin, json={"version": "1.0.0"}
    )  # roll back
    assert resp.status_code == 200 and resp.json()["bundles"][0]["active"] == "1.0.0"
    resp = await h.client.post(f"/v1/policies/{b}/shadow", headers=admin,
                               json={"version": "2.0.0"})
    assert resp.json()["bundles"][0]["shadow"] == "2.0.0"
    ids = [(await decide(h, runtime)).json() for _ in range(3)]
    assert all(d["effect"] == "allow" for d in ids)  # only the active version acts

    report = (await h.client.get(f"/v1/policies/{b}/shadow", headers=admin)).json()
    assert report["compared"] == 3 and report["disagreements"] == 3
    assert report["by_tool"] == {"issue_refund": 3}
    assert report["by_effect"][0]["transition"] == "allow -> deny"
    assert sorted(report["by_effect"][0]["examples"]) == sorted(d["decision_id"] for d in ids)
    types = await event_types(h, tenant)
    assert "policy.activated" in types and "policy.shadowed" in types

    resp = await h.client.post(f"/v1/policies/{b}/activate", headers=admin,
                               json={"version": "9.9.9"})
    assert (resp.status_code, resp.json()["code"]) == (422, "unknown_policy_version")
    resp = await h.client.post(
        "/v1/policies/nope/activate", headers=admin, json={"version": "1.0.0"}
    )
    assert resp.status_code == 404
    resp = await h.client.post(
        f"/v1/policies/{b}/activate", headers=runtime, json={"version": "2.0.0"}
    )
    assert resp.status_code == 403


def cli_test(paths: list[Path], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = run_test(argparse.Namespace(paths=paths, verbose=True), Settings(key_dir=Path("unused")))
    return code, capsys.readouterr().out


def test_cli_policy_test_passes_the_refund_bundles(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = cli_test([ROOT / "policies/refunds", ROOT / "rego"], capsys)
    assert code == 0, out
    assert "PASS  data.cosigner.refunds_test.test_read_tool_allowed" in out
    assert out.strip().splitlines()[-1].endswith(" 0 failed")


def test_cli_policy_test_fails_on_a_broken_case(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_rego(tmp_path, "b", "1.0.0", GOOD)
    manifest = tmp_path / "b" / "manifest.toml"
    manifest.write_text(manifest.read_text() + 'cases = "cases.yaml"\n')
    (tmp_path / "b" / "cases.yaml").write_text(
        "- {description: wrong on purpose, input: {tool: {name: x}}, want: {effect: deny}}\n"
    )
    code, out = cli_test([tmp_path / "b"], capsys)
    assert code == 1
    assert "FAIL  wrong on purpose: want effect deny, got allow" in out
    assert out.strip().splitlines()[-1] == "0 passed, 1 failed"


def test_cli_policy_test_fails_on_a_bundle_that_does_not_compile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_rego(tmp_path, "b", "1.0.0", BROKEN)
    code, out = cli_test([tmp_path / "b"], capsys)
    assert code == 1
    assert "ERROR" in out and "policy.rego:3:" in out
