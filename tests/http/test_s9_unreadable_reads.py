"""Readers of decision-log event bodies outside the audit API, with an event that does not
read (its row before deleted by hand, its frame damaged, its text garbled:
tests/audit/damage.py): policy replay and the shadow report count it and answer, the run
panel lists the decision without its logged arguments, an approval's view does not read
the log at all. No 500, no crash. Session 9."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.db.tables import audit_events
from cosigner.runs.timeline import run_timeline
from tests.audit.damage import KINDS, damage, seqs, stored
from tests.conftest import Harness, decision_request
from tests.http.replay_helpers import runtime_caller, seed
from tests.http.test_policies import GOOD, V2, write_rego
from tests.http.test_policy_replay import _setup

ev = audit_events.c


async def _decision_ids(h: Harness, tenant: str) -> dict[int, str]:
    """``{seq: decision id}`` of ``tenant``'s ``decision.made`` events."""
    async with h.db.read() as conn:
        return {int(s): d for s, d in (await conn.execute(select(ev.seq, ev.decision_id).where(
            ev.tenant == tenant, ev.type == "decision.made"))).all()}


async def _damage_a_decision(h: Harness, tenant: str, kind: str) -> tuple[set[str], set[str]]:
    """Damage a ``decision.made`` event past the first ones (a pair's head); the ids of
    the decisions whose event no longer reads, and of those whose event is gone."""
    made = await _decision_ids(h, tenant)
    rows = await stored(h, tenant)
    target = next(s for s in sorted(made) if s > 3 and rows[s][0] == 4)
    hit = await damage(h, tenant, target, kind)
    gone = {target - 1} if kind == "row_before_deleted" else set()
    return ({made[s] for s in hit - gone if s in made}, {made[s] for s in gone if s in made})


@pytest.mark.parametrize("kind", KINDS)
async def test_replay_counts_what_does_not_read(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str, kind: str,
        caplog: pytest.LogCaptureFixture) -> None:
    h, bundle, admin = await _setup(harness_factory, tmp_path, tenant)
    await seed(h.context, runtime_caller(tenant), 12, chunk=1)
    unreadable, gone = await _damage_a_decision(h, tenant, kind)
    assert unreadable
    with caplog.at_level(logging.WARNING, logger="cosigner.audit"):
        resp = await h.client.post(f"/v1/policies/{bundle}/replay", headers=admin,
                                   json={"version": "2.0.0"})
    assert resp.status_code == 200, resp.text
    report = resp.json()
    assert report["decisions"] == 12 - len(gone)
    (group,) = [g for g in report["not_replayed"] if g["reason"] == "event_unreadable"]
    assert group["count"] == len(unreadable) and set(group["examples"]) == unreadable
    assert "left out of a policy replay" in caplog.text


@pytest.mark.parametrize("kind", KINDS)
async def test_shadow_report_counts_what_does_not_read(
        harness_factory: Any, tenant: str, tmp_path: Path, kind: str) -> None:
    root = tmp_path / "bundles"
    b = f"s9-{tenant}"
    write_rego(root, "b1", "1.0.0", GOOD, bundle_id=b, tenants=f'"{tenant}"')
    write_rego(root, "b2", "2.0.0", V2, bundle_id=b, tenants=f'"{tenant}"')
    h: Harness = await harness_factory(bundle_dirs=[root])
    admin = await h.headers(tenant, "admin")
    runtime = await h.headers(tenant, "runtime")
    assert (await h.client.post(f"/v1/policies/{b}/activate", headers=admin,
                                json={"version": "1.0.0"})).status_code == 200
    assert (await h.client.post(f"/v1/policies/{b}/shadow", headers=admin,
                                json={"version": "2.0.0"})).status_code == 200
    for _ in range(5):
        resp = await h.client.post("/v1/decisions", headers=runtime, json=decision_request())
        assert resp.status_code == 200 and resp.json()["effect"] == "allow"
    unreadable, gone = await _damage_a_decision(h, tenant, kind)
    resp = await h.client.get(f"/v1/policies/{b}/shadow", headers=admin)
    assert resp.status_code == 200, resp.text
    report = resp.json()
    assert report["unreadable"]["count"] == len(unreadable)
    assert set(report["unreadable"]["examples"]) == unreadable
    assert report["compared"] == report["disagreements"] == 5 - len(unreadable) - len(gone)


@pytest.mark.parametrize("kind", KINDS)
async def test_run_panel_lists_a_decision_whose_event_does_not_read(
        harness: Harness, tenant: str, kind: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    run = f"run-{tenant}"
    for amount in (5000, 150000, 250000, 5000, 5000, 5000):
        body = decision_request(run={"id": run})
        body["args"]["amount_minor"] = amount
        resp = await harness.client.post("/v1/decisions", headers=runtime, json=body)
        assert resp.status_code == 200, resp.text
    before = await run_timeline(harness.db, tenant=tenant, run_id=run,
                                now=harness.context.clock())
    assert all(e["args"] is not None for e in before["entries"])
    unreadable, gone = await _damage_a_decision(harness, tenant, kind)
    panel = await run_timeline(harness.db, tenant=tenant, run_id=run,
                               now=harness.context.clock())
    assert panel["total"] == 6 and len(panel["entries"]) == 6  # from the decisions table
    for entry, old in zip(panel["entries"], before["entries"], strict=True):
        lost = entry["decision_id"] in unreadable | gone
        assert entry == ({**old, "args": None} if lost else old)


async def test_an_approval_view_does_not_depend_on_its_decision_event(
        harness: Harness, tenant: str) -> None:
    """The approval request and its view hold their own (masked) arguments: its decision's
    event damaged, the view still answers, unchanged."""
    runtime = await harness.headers(tenant, "runtime")
    for _ in range(2):
        await harness.client.post("/v1/decisions", headers=runtime, json=decision_request())
    body = decision_request()
    body["args"]["amount_minor"] = 150000
    decision = (await harness.client.post("/v1/decisions", headers=runtime,
                                          json=body)).json()
    approval = decision["approval"]["id"]
    before = await harness.client.get(f"/v1/approvals/{approval}", headers=runtime)
    assert before.status_code == 200, before.text
    (seq,) = await seqs(harness, tenant, "decision.made",
                        decision_id=decision["decision_id"])
    await damage(harness, tenant, seq, "frame_damaged")
    after = await harness.client.get(f"/v1/approvals/{approval}", headers=runtime)
    assert after.status_code == 200, after.text
    assert ({k: v for k, v in after.json().items() if k != "retry_after"}
            == {k: v for k, v in before.json().items() if k != "retry_after"})
