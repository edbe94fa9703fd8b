"""Replay of logged decisions against a candidate bundle (issue 18):
``POST /v1/policies/{id}/replay`` and ``cosigner policy replay``."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from cosigner.cli.main import main as cli_main
from cosigner.core.clock import isoformat
from cosigner.db.tables import audit_events, decisions, permits
from cosigner.db.tables_approvals import approvals, call_inputs
from cosigner.decisions.pdp import decide, input_document
from cosigner.policy.store import run_bundle
from tests.conftest import Harness
from tests.http.replay_helpers import CANDIDATE, LIVE, request, runtime_caller, seed, write_version


async def _setup(harness_factory: Callable[..., Any], tmp_path: Path, tenant: str,
                 **settings: Any) -> tuple[Harness, str, dict[str, str]]:
    bundle = f"rp-{tenant}"
    root = tmp_path / "bundles"
    write_version(root, bundle, "1.0.0", LIVE, [tenant])
    write_version(root, bundle, "2.0.0", CANDIDATE, [tenant])
    h: Harness = await harness_factory(bundle_dirs=[root], **settings)
    admin = await h.headers(tenant, "admin")
    resp = await h.client.post(f"/v1/policies/{bundle}/activate", headers=admin,
                               json={"version": "1.0.0"})
    assert resp.status_code == 200, resp.text
    return h, bundle, admin


async def _counts(h: Harness, tenant: str) -> dict[str, int]:
    async with h.db.read() as conn:
        out = {}
        for table in (decisions, permits, approvals, call_inputs, audit_events):
            out[table.name] = (await conn.execute(
                select(func.count()).select_from(table).where(table.c.tenant == tenant)
            )).scalar_one()
    return out


async def test_replay_over_10000_logged_decisions_matches_evaluating_the_candidate(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    h, bundle, admin = await _setup(harness_factory, tmp_path, tenant, log_batch_max=1000)
    caller = runtime_caller(tenant)
    started = time.perf_counter()
    seeded = await seed(h.context, caller, 10_000)
    seeding_s = time.perf_counter() - started
    candidate = h.context.store.snapshot.bundles[bundle]["2.0.0"]
    expected: Counter[tuple[str, str, str]] = Counter()
    errors = 0
    for req, response in seeded:
        doc = input_document(caller, req, now=isoformat(h.context.clock()))
        result = await run_bundle(candidate, doc)
        errors += any(r.code == "policy_error" for r in result.reasons)
        if result.effect != response["effect"]:
            expected[(req.tool["name"], response["effect"], result.effect)] += 1
    before = await _counts(h, tenant)

    started = time.perf_counter()
    resp = await h.client.post(f"/v1/policies/{bundle}/replay", headers=admin,
                               json={"version": "2.0.0"})
    replay_s = time.perf_counter() - started
    assert resp.status_code == 200, resp.text
    report = resp.json()
    print(f"seeded 10,000 decisions in {seeding_s:.1f} s, replayed in {replay_s:.1f} s")

    assert report["decisions"] == report["replayed"] == 10_000
    got = {(t["tool"], t["from"], t["to"]): t["count"] for t in report["transitions"]}
    assert got == dict(expected) and expected  # the same transitions, and some exist
    assert report["changed"] == sum(expected.values())
    # every transition cites real decisions of that tool with that logged effect
    effects = {resp_["decision_id"]: (req.tool["name"], resp_["effect"])
               for req, resp_ in seeded}
    for t in report["transitions"]:
        assert t["examples"] and all(effects[d] == (t["tool"], t["from"])
                                     for d in t["examples"])
    assert [(e["code"], e["count"]) for e in report["errors"]] == [("policy_error", errors)]
    assert errors > 0
    # nothing written but one policy.replayed event in the tenant's chain
    after = await _counts(h, tenant)
    assert after == {**before, "audit_events": before["audit_events"] + 1}
    async with h.db.read() as conn:
        last = (await conn.execute(select(audit_events.c.type, audit_events.c.body)
                                   .where(audit_events.c.tenant == tenant)
                                   .order_by(audit_events.c.seq.desc()).limit(1))).one()
    assert last.type == "policy.replayed"
    assert json.loads(last.body)["payload"]["changed"] == report["changed"]


async def test_replay_names_masked_values_the_candidate_reads(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    bundle = f"rm-{tenant}"
    root = tmp_path / "bundles"
    live = "def decide(input):\n    return {'effect': 'allow'}\n"
    reads_secret = ("def decide(input):\n"
                    "    if input['tool']['name'] == 'plain':\n"
                    "        return {'effect': 'deny', 'reasons': ['plain']}\n"
                    "    if input['args']['api_key'].startswith('live_'):\n"
                    "        return {'effect': 'deny', 'reasons': ['live key']}\n"
                    "    return {'effect': 'allow'}\n")
    write_version(root, bundle, "1.0.0", live, [tenant])
    write_version(root, bundle, "2.0.0", reads_secret, [tenant])
    h: Harness = await harness_factory(bundle_dirs=[root])
    admin = await h.headers(tenant, "admin")
    assert (await h.client.post(f"/v1/policies/{bundle}/activate", headers=admin,
                                json={"version": "1.0.0"})).status_code == 200
    caller = runtime_caller(tenant)
    secret = await decide(h.context, caller, request(
        1, tool="charge", args={"api_key": "live_123", "amount": 5}))
    plain = await decide(h.context, caller, request(2, tool="plain", args={"amount": 5}))
    # masked but never read by the candidate: replayed
    ignored = await decide(h.context, caller, request(
        3, tool="plain", args={"api_key": "live_9", "amount": 1}))

    resp = await h.client.post(f"/v1/policies/{bundle}/replay", headers=admin,
                               json={"version": "2.0.0"})
    assert resp.status_code == 200, resp.text
    report = resp.json()
    assert report["replayed"] == 2 and report["decisions"] == 3
    assert report["not_replayed"] == [{"reason": "reads_masked_values", "count": 1,
                                       "examples": [secret["decision_id"]]}]
    assert report["masked_values_read"] == {"/args/api_key": 1}
    assert report["transitions"] == [{
        "tool": "plain", "from": "allow", "to": "deny", "count": 2,
        "examples": [plain["decision_id"], ignored["decision_id"]]}]
    assert "live_123" not in resp.text


async def test_replay_of_denied_calls_and_its_tenancy_and_window(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    h, bundle, admin = await _setup(harness_factory, tmp_path, tenant)
    caller = runtime_caller(tenant)
    denied = await decide(h.context, caller, request(1, tool="transfer",
                                                     args={"amount": 85}))
    assert denied["effect"] == "deny"
    resp = await h.client.post(f"/v1/policies/{bundle}/replay", headers=admin,
                               json={"version": "2.0.0"})
    # a deny is rebuilt from its event (with the caller's roles): 85 -> reviewed
    assert resp.json()["transitions"] == [{"tool": "transfer", "from": "deny",
                                           "to": "require_approval", "count": 1,
                                           "examples": [denied["decision_id"]]}]
    later = await h.client.post(f"/v1/policies/{bundle}/replay", headers=admin,
                                json={"version": "2.0.0", "since": "2999-01-01T00:00:00Z"})
    assert later.status_code == 200 and later.json()["decisions"] == 0
    other = await h.headers("other-" + tenant, "admin")
    refused = await h.client.post(f"/v1/policies/{bundle}/replay", headers=other,
                                  json={"version": "2.0.0"})
    assert refused.status_code == 404
    runtime = await h.headers(tenant, "runtime")
    assert (await h.client.post(f"/v1/policies/{bundle}/replay", headers=runtime,
                                json={"version": "2.0.0"})).status_code == 403


async def test_cli_policy_replay_reads_the_database(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str,
        monkeypatch: Any, capsys: Any) -> None:
    h, bundle, _ = await _setup(harness_factory, tmp_path, tenant)
    caller = runtime_caller(tenant)
    allowed = await decide(h.context, caller, request(1, tool="transfer",
                                                      args={"amount": 55}))
    assert allowed["effect"] == "require_approval"
    monkeypatch.setenv("COSIGNER_DATABASE_URL", h.settings.database_url)
    candidate = tmp_path / "bundles" / f"{bundle}-2.0.0"
    import asyncio

    code = await asyncio.to_thread(cli_main, ["policy", "replay", str(candidate),
                                              "--tenant", tenant, "--since", "2000-01-01"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["decisions"] == 1 and report["changed"] == 0
    assert report["by_tool"] == {"transfer": {"replayed": 1, "changed": 0,
                                              "not_replayed": 0}}
