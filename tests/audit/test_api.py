"""The audit API: auditor-only, tenant-scoped, filtered, paginated; exports that verify."""

from __future__ import annotations

import csv
import io

from cosigner.audit.verify import verify_export
from tests.audit.conftest import checkpoint, decide, export_lines, jwks, records
from tests.conftest import Harness, decision_request


async def test_auditor_key_cannot_decide(harness: Harness, tenant: str) -> None:
    auditor = await harness.headers(tenant, "auditor")
    resp = await harness.client.post("/v1/decisions", headers=auditor, json=decision_request())
    assert resp.status_code == 403 and resp.json()["code"] == "forbidden"


async def test_runtime_key_cannot_read_the_audit_api(harness: Harness, tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    for method, path in (("GET", "/v1/audit/events"), ("GET", "/v1/audit/checkpoints"),
                         ("POST", "/v1/audit/checkpoints"), ("GET", "/v1/audit/export")):
        resp = await harness.client.request(method, path, headers=runtime)
        assert resp.status_code == 403, (path, resp.text)
    approver = await harness.headers(tenant, "finance")
    assert (await harness.client.get("/v1/audit/events", headers=approver)).status_code == 403
    assert (await harness.client.get("/v1/audit/events")).status_code == 401


async def test_no_tenant_sees_another_tenants_events(harness: Harness, tenant: str) -> None:
    other = tenant + "-b"
    decided = await decide(harness, await harness.headers(tenant, "runtime"))
    await decide(harness, await harness.headers(other, "runtime"))
    auditor_b = await harness.headers(other, "auditor")
    page = (await harness.client.get("/v1/audit/events", headers=auditor_b)).json()
    assert page["events"] and {e["tenant"] for e in page["events"]} == {other}
    by_id = await harness.client.get("/v1/audit/events", headers=auditor_b,
                                     params={"decision_id": decided["decision_id"]})
    assert by_id.json()["events"] == []
    lines = await export_lines(harness, auditor_b)
    assert decided["decision_id"] not in "".join(lines)
    assert {r["body"]["tenant"] for r in records(lines) if r["kind"] == "event"} == {other}
    cps = (await harness.client.get("/v1/audit/checkpoints", headers=auditor_b)).json()
    assert {c["tenant"] for c in cps["checkpoints"]} == {other}


async def test_filters_and_cursor_pagination_in_seq_order(harness: Harness,
                                                         tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    auditor = await harness.headers(tenant, "auditor")
    made = [await decide(harness, runtime, amount) for amount in (5000, 250000, 5000, 99)]
    seen: list[int] = []
    cursor = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = (await harness.client.get("/v1/audit/events", headers=auditor,
                                         params=params)).json()
        seen += [e["seq"] for e in page["events"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(range(1, len(seen) + 1))
    denies = (await harness.client.get("/v1/audit/events", headers=auditor, params={
        "type": "decision.made", "effect": "deny"})).json()["events"]
    assert [e["subject"]["decision_id"] for e in denies] == [made[1]["decision_id"]]
    one = (await harness.client.get("/v1/audit/events", headers=auditor, params={
        "decision_id": made[2]["decision_id"]})).json()["events"]
    assert [e["type"] for e in one] == ["decision.made", "permit.minted"]
    assert all(e["hash"].startswith("sha256:") for e in one)
    by_policy = (await harness.client.get("/v1/audit/events", headers=auditor, params={
        "policy_id": "refunds", "tool": "issue_refund", "run_id": "run-1",
        "principal": "customer-42", "until": "2999-01-01T00:00:00Z",
        "since": "2000-01-01T00:00:00Z"})).json()["events"]
    assert len([e for e in by_policy if e["type"] == "decision.made"]) == 4
    bad = await harness.client.get("/v1/audit/events", headers=auditor,
                                   params={"cursor": "!!"})
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_cursor"
    too_many = await harness.client.get("/v1/audit/events", headers=auditor,
                                        params={"limit": "1001"})
    assert too_many.status_code == 422


async def test_decision_flow_export_reads_in_order(harness: Harness, tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    auditor = await harness.headers(tenant, "auditor")
    allowed = await decide(harness, runtime, 5000)
    lines = await export_lines(harness, auditor)
    story = [(r["body"]["type"], r["body"]["subject"].get("decision_id"))
             for r in records(lines) if r["kind"] == "event"
             and r["body"]["subject"].get("decision_id") == allowed["decision_id"]]
    assert story == [("decision.made", allowed["decision_id"]),
                     ("permit.minted", allowed["decision_id"])]
    seqs = [r["body"]["seq"] for r in records(lines) if r["kind"] == "event"]
    assert seqs == sorted(seqs)
    assert verify_export(lambda: iter(lines), await jwks(harness)).ok


async def test_export_since_until_is_widened_to_signed_anchors(harness: Harness,
                                                               tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    auditor = await harness.headers(tenant, "auditor")
    for _ in range(3):
        await decide(harness, runtime)
    cp = await checkpoint(harness, auditor)
    for _ in range(3):
        await decide(harness, runtime)
    events = (await harness.client.get("/v1/audit/events", headers=auditor)).json()["events"]
    since = events[cp["seq"] + 1]["time"]  # after the checkpoint
    lines = await export_lines(harness, auditor, since=since)
    header = records(lines)[0]
    assert header["anchor"]["seq"] == cp["seq"] and header["first_seq"] == cp["seq"] + 1
    assert verify_export(lambda: iter(lines), await jwks(harness)).ok
    until_lines = await export_lines(harness, auditor, until=since)
    assert verify_export(lambda: iter(until_lines), await jwks(harness)).ok


async def test_csv_export_has_one_row_per_event(harness: Harness, tenant: str) -> None:
    await decide(harness, await harness.headers(tenant, "runtime"))
    auditor = await harness.headers(tenant, "auditor")
    resp = await harness.client.get("/v1/audit/export", headers=auditor,
                                    params={"format": "csv"})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(resp.text)))
    assert [r["type"] for r in rows][-3:] == ["decision.made", "permit.minted",
                                              "principal.created"]
    assert [int(r["seq"]) for r in rows] == list(range(1, len(rows) + 1))


async def test_checkpoints_are_listed_and_verify_against_the_jwks(harness: Harness,
                                                                  tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    auditor = await harness.headers(tenant, "auditor")
    assert (await harness.client.get("/v1/audit/checkpoints",
                                     headers=auditor)).json()["checkpoints"] == []
    await decide(harness, runtime)
    first = await checkpoint(harness, auditor)
    assert await checkpoint(harness, auditor) == first  # nothing new: same checkpoint
    await decide(harness, runtime)
    second = await checkpoint(harness, auditor)
    listed = (await harness.client.get("/v1/audit/checkpoints", headers=auditor,
                                       params={"limit": "1"})).json()
    assert listed["checkpoints"] == [first] and listed["next_cursor"]
    rest = (await harness.client.get("/v1/audit/checkpoints", headers=auditor, params={
        "cursor": listed["next_cursor"]})).json()
    assert rest["checkpoints"] == [second] and rest["next_cursor"] is None
    claims = harness.context.keyring.verify(second["token"],
                                                  typ="cosigner-checkpoint+jwt")
    assert claims == {"tenant": tenant, "seq": second["seq"], "hash": second["hash"],
                      "time": second["time"]}
