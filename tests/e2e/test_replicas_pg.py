"""Two live ``cosigner serve`` processes on one PostgreSQL database (issue 9, DESIGN § Scale,
invariants 4 and 9): single use, quorum, joining and the chain are settled by the database,
never by one process's memory."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from cosigner.audit.verify import verify_export
from tests.conftest import ROOT, LiveServer, decision_request
from tests.e2e.helpers import AMOUNT, PYTHON_BUNDLES, client, make_keys, read_log, refund
from tests.http.approval_helpers import needs, write_scripted_bundle

pytestmark = pytest.mark.slow


@pytest.fixture
def two_servers(db_kind: str, live_server_factory: Callable[..., LiveServer]
                ) -> Callable[..., tuple[LiveServer, LiveServer]]:
    if db_kind != "postgres":
        pytest.skip("two serving processes need a shared PostgreSQL database: run with "
                    "--db postgres (SQLite supports one serving process)")

    def start(**env: str) -> tuple[LiveServer, LiveServer]:
        env = {"COSIGNER_BUNDLE_DIRS": PYTHON_BUNDLES, **env}
        return live_server_factory(**env), live_server_factory(**env)

    return start


async def test_1000_concurrent_redeems_on_two_replicas_one_success(
        two_servers: Callable[..., tuple[LiveServer, LiveServer]], database_url: str,
        tenant: str) -> None:
    a, b = two_servers()
    keys = await make_keys(database_url, tenant, {"runtime": (["runtime"], "rt")})
    auth = {"Authorization": keys["runtime"]}
    # All 1,000 are in flight at once from the client; 24 per replica on the wire (each
    # replica's pool holds 20 PostgreSQL connections, so more would only queue there).
    async with client(a.url, connections=24) as ca, client(b.url, connections=24) as cb:
        body = refund(AMOUNT["allow"])
        decided = await ca.post("/v1/decisions", headers=auth, json=body)
        assert decided.status_code == 200 and decided.json()["effect"] == "allow"
        permit = decided.json()["permit"]
        redeem = {"permit": permit["token"], "tool": "issue_refund", "args": body["args"]}
        # Warm both pools so the burst is about the permit row, not connection set-up.
        await asyncio.gather(*(c.get("/healthz") for c in (ca, cb) for _ in range(50)))
        responses = await asyncio.gather(*(
            (ca if i % 2 else cb).post("/v1/permits/redeem", headers=auth, json=redeem)
            for i in range(1000)))
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {200: 1, 409: 999}, statuses
    assert {r.json()["code"] for r in responses if r.status_code == 409} == {
        "already_redeemed"}
    log = await read_log(database_url, tenant)
    log.assert_consistent()
    assert [e.permit_jti for e in log.of_type("permit.redeemed")] == [permit["jti"]]
    refused = log.of_type("permit.refused")
    assert len(refused) == 999  # every refusal is in the log too
    assert [r.status for r in log.permit_rows] == ["redeemed"]


async def test_concurrent_reviews_on_two_replicas_mint_one_permit_per_quorum(
        two_servers: Callable[..., tuple[LiveServer, LiveServer]], database_url: str,
        tenant: str, tmp_path: Path) -> None:
    bundles = write_scripted_bundle(tmp_path / "bundles")
    a, b = two_servers(COSIGNER_BUNDLE_DIRS=json.dumps([str(bundles)]))
    approvers = [f"fin-{i}" for i in range(4)]
    keys = await make_keys(database_url, tenant, {
        "runtime": (["runtime"], "rt"),
        **{s: (["finance"], s) for s in approvers}})
    runtime = {"Authorization": keys["runtime"]}
    async with client(a.url) as ca, client(b.url) as cb:
        opened = await asyncio.gather(*(
            ca.post("/v1/decisions", headers=runtime, json=decision_request(
                run={"id": f"run-{i}"}, tool={"name": "delete_file"},
                args={"path": f"/tmp/{i}"}, context={"result": needs(("finance", 2))}))
            for i in range(20)))
        assert {r.status_code for r in opened} == {200}
        approval_ids = [r.json()["approval"]["id"] for r in opened]
        # Four approvers review every request at once, alternating replicas: two of them
        # complete the quorum, the others find it met or the request decided.
        jobs = [((ca, cb)[(i + j) % 2], approval_id, subject)
                for i, approval_id in enumerate(approval_ids)
                for j, subject in enumerate(approvers)]
        reviews = await asyncio.gather(*(
            c.post(f"/v1/approvals/{approval_id}/reviews",
                   headers={"Authorization": keys[subject]},
                   json={"decision": "approved", "comment": "ok"})
            for c, approval_id, subject in jobs))
        states = await asyncio.gather(*(
            cb.get(f"/v1/approvals/{approval_id}", headers=runtime)
            for approval_id in approval_ids))
    assert all(r.status_code < 500 for r in reviews), [r.text for r in reviews
                                                        if r.status_code >= 500]
    by_approval: dict[str, list[httpx.Response]] = {}
    for (_, approval_id, _), resp in zip(jobs, reviews, strict=True):
        by_approval.setdefault(approval_id, []).append(resp)
    for approval_id, answers in by_approval.items():
        accepted = [r for r in answers if r.status_code == 200]
        assert len(accepted) == 2, (approval_id, [(r.status_code, r.text) for r in answers])
        assert {r.json()["code"] for r in answers if r.status_code != 200} <= {
            "approval_not_pending", "role_already_met"}
    assert {s.json()["status"] for s in states} == {"approved"}
    log = await read_log(database_url, tenant)
    log.assert_consistent()
    minted = Counter(e.approval_id for e in log.of_type("permit.minted"))
    assert minted == Counter({approval_id: 1 for approval_id in approval_ids})
    assert Counter(e.approval_id for e in log.of_type("approval.approved")) == minted
    assert len(log.permit_rows) == 20
    jtis = {s.json()["permit"]["jti"] for s in states}
    assert jtis == {r.jti for r in log.permit_rows}


async def test_identical_pending_requests_on_two_replicas_join_one_approval(
        two_servers: Callable[..., tuple[LiveServer, LiveServer]], database_url: str,
        tenant: str) -> None:
    a, b = two_servers()
    keys = await make_keys(database_url, tenant, {"runtime": (["runtime"], "rt")})
    auth = {"Authorization": keys["runtime"]}
    calls = [refund(AMOUNT["require_approval"] + i, run=f"run-{i}") for i in range(10)]
    sends = [(i, replica) for i in range(len(calls)) for replica in range(2) for _ in range(8)]
    async with client(a.url) as ca, client(b.url) as cb:
        responses = await asyncio.gather(*(
            (ca, cb)[replica].post("/v1/decisions", headers=auth, json={
                **calls[i], "request_id": f"req-{uuid.uuid4().hex}"})
            for i, replica in sends))
    assert [r.text for r in responses if r.status_code != 200] == []
    by_call: dict[int, set[str]] = {}
    for (i, _), resp in zip(sends, responses, strict=True):
        assert resp.json()["effect"] == "require_approval"
        by_call.setdefault(i, set()).add(resp.json()["approval"]["id"])
    assert all(len(ids) == 1 for ids in by_call.values()), by_call
    assert len({next(iter(ids)) for ids in by_call.values()}) == len(calls)
    log = await read_log(database_url, tenant)
    log.assert_consistent()
    assert len(log.of_type("approval.requested")) == len(calls)
    assert len(log.of_type("approval.joined")) == len(sends) - len(calls)
    assert len(log.of_type("decision.made")) == len(sends)


async def test_chain_stays_linear_under_concurrent_writers_on_two_replicas(
        two_servers: Callable[..., tuple[LiveServer, LiveServer]], database_url: str,
        tenant: str, tmp_path: Path) -> None:
    a, b = two_servers()
    tenants = [tenant, f"{tenant}-b", f"{tenant}-c"]
    keys: dict[str, dict[str, str]] = {}
    for t in tenants:
        keys[t] = await make_keys(database_url, t, {"runtime": (["runtime"], "rt"),
                                                    "auditor": (["auditor"], "aud")})
    kinds = ["allow", "deny", "require_approval"]
    jobs = [(t, kinds[i % 3], i % 2) for i in range(120) for t in tenants]
    async with client(a.url) as ca, client(b.url) as cb:
        responses = await asyncio.gather(*(
            (ca, cb)[replica].post("/v1/decisions",
                                   headers={"Authorization": keys[t]["runtime"]},
                                   json=refund(AMOUNT[kind]))
            for t, kind, replica in jobs))
        assert [r.text for r in responses if r.status_code != 200] == []
        exports = {t: (await ca.get("/v1/audit/export",
                                    headers={"Authorization": keys[t]["auditor"]})).text
                   for t in tenants}
        jwks = (await cb.get("/.well-known/jwks.json")).json()
    for t in tenants:
        log = await read_log(database_url, t)
        log.assert_consistent()
        mine = {r.json()["decision_id"] for (rt, _, _), r in zip(jobs, responses, strict=True)
                if rt == t}
        assert {e.decision_id for e in log.of_type("decision.made")} == mine
        lines = exports[t].splitlines()
        report = verify_export(lambda lines=lines: iter(lines), jwks)
        assert report.ok, report.as_dict()
        assert report.events == len(log.events)
    out = tmp_path / "export.jsonl"
    out.write_text(exports[tenant])
    (tmp_path / "jwks.json").write_text(json.dumps(jwks))
    verified = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cosigner", "audit", "verify", str(out), "--jwks",
        str(tmp_path / "jwks.json"), cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await verified.communicate()
    assert verified.returncode == 0, (stdout, stderr)
    assert stdout.decode().startswith("ok: ")
