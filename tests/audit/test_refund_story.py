"""The refund scenario's export reads as one story, in order, and verifies (issue 6)."""

from __future__ import annotations

from cosigner.audit.verify import verify_export
from tests.audit.conftest import export_lines, jwks, records
from tests.conftest import Harness, decision_request
from tests.http.approval_helpers import redeem, refund_args, review, state


async def test_refund_export_reads_decision_to_outcome_in_order(harness: Harness,
                                                                tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime", subject="orchestrator")
    alice = await harness.headers(tenant, "finance", subject="alice")
    auditor = await harness.headers(tenant, "auditor")
    body = decision_request(run={"id": "run-refund"}, args=refund_args(150_000))
    decision = (await harness.client.post("/v1/decisions", headers=runtime, json=body)).json()
    assert decision["effect"] == "require_approval"
    approval_id = decision["approval"]["id"]
    assert (await review(harness, alice, approval_id)).status_code == 200
    token = (await state(harness, runtime, approval_id))["permit"]["token"]
    assert (await redeem(harness, runtime, token, "issue_refund",
                         refund_args(150_000))).status_code == 200
    outcome = await harness.client.post(
        f"/v1/decisions/{decision['decision_id']}/outcome", headers=runtime,
        json={"outcome": "ok", "side_effect": "committed"})
    assert outcome.status_code == 200, outcome.text

    lines = await export_lines(harness, auditor)
    assert verify_export(lambda: iter(lines), await jwks(harness)).ok
    story = [r["body"] for r in records(lines) if r["kind"] == "event" and (
        r["body"]["subject"].get("decision_id") == decision["decision_id"]
        or r["body"]["subject"].get("approval_id") == approval_id)]
    types = [e["type"] for e in story]
    wanted = ["decision.made", "approval.requested", "approval.reviewed", "approval.approved",
              "permit.minted", "permit.redeemed", "outcome.reported"]
    assert [t for t in types if t in wanted] == wanted, types
    reviewed = next(e for e in story if e["type"] == "approval.reviewed")
    assert reviewed["actor"]["subject"] == "alice"
    assert all(e["args_hash"] in (None, decision["args_hash"]) for e in story)
