"""Program barriers (issue 18): trusted runtime code (role ``barrier``) opens an approval
over a context document; the policy may only raise its requirement; the approved permit
is bound to the context hash and redeemed once."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from cosigner.db.tables import audit_events
from tests.conftest import Harness, decision_request
from tests.http.approval_helpers import review

RULES = """
def decide(input):
    if input["tool"]["name"] != "cosigner.barrier":
        return {"effect": "allow"}
    doc = input["args"]
    if doc.get("forbidden"):
        return {"effect": "deny", "reasons": ["barrier_forbidden"]}
    if doc.get("kind") == "deploy":
        return {"effect": "require_approval", "reasons": ["deploys_need_two"],
                "mask": ["/secret_note"],
                "approval": {"require": [{"role": "finance", "count": 2},
                                         {"role": "security", "count": 1}],
                             "timeout_ms": 60000, "distinct_from": "previous"}}
    return {"effect": "allow"}
"""

DEPLOY = {"kind": "deploy", "service": "payments", "secret_note": "rotate-at-dawn"}


def _bundle(root: Path) -> Path:
    folder = root / "barriers"
    folder.mkdir(parents=True)
    (folder / "manifest.toml").write_text(
        'id = "barriers"\nversion = "1"\nengine = "python"\nentrypoint = "decide"\n'
        'tenants = ["*"]\n')
    (folder / "rules.py").write_text(RULES)
    return root


async def _harness(harness_factory: Callable[..., Any], tmp_path: Path) -> Harness:
    h: Harness = await harness_factory(bundle_dirs=[_bundle(tmp_path / "bundles")])
    return h


def barrier(context: dict[str, Any], *, require: list[dict[str, Any]] | None = None,
            timeout_ms: int = 600_000, distinct_from: str = "initiator",
            run: str | None = None) -> dict[str, Any]:
    return {"run": {"id": run or f"run-{uuid.uuid4().hex[:8]}"}, "context": context,
            "require": require or [{"role": "finance", "count": 1}],
            "timeout_ms": timeout_ms, "distinct_from": distinct_from}


async def _redeem(h: Harness, headers: dict[str, str], token: str,
                  context: dict[str, Any]) -> Any:
    return await h.client.post("/v1/permits/redeem", headers=headers, json={
        "permit": token, "tool": "cosigner.barrier", "args": context})


async def test_a_barrier_weaker_than_the_policy_is_raised_to_the_policys(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    h = await _harness(harness_factory, tmp_path)
    program = await h.headers(tenant, "runtime", "barrier", subject="deploy-bot")
    resp = await h.client.post("/v1/approvals", headers=program, json=barrier(DEPLOY))
    assert resp.status_code == 200, resp.text
    opened = resp.json()
    # asked: finance x1, 10 min, initiator -> policy: finance x2 + security, 1 min, previous
    assert opened["barrier"]["raised"] is True
    assert opened["require"] == [{"role": "finance", "count": 2},
                                 {"role": "security", "count": 1}]
    assert opened["distinct_from"] == "initiator_and_previous"
    lifetime = (datetime.fromisoformat(opened["expires_at"].replace("Z", "+00:00"))
                - datetime.fromisoformat(opened["created_at"].replace("Z", "+00:00")))
    assert lifetime.total_seconds() == 60
    assert opened["kind"] == "barrier" and opened["tool"] == "cosigner.barrier"
    # the context is shown masked where the policy says so
    assert opened["args"]["secret_note"] == "•••" and "rotate-at-dawn" not in resp.text

    approval_id = opened["id"]
    for subject, role in (("fin-a", "finance"), ("fin-b", "finance")):
        r = await review(h, await h.headers(tenant, role, subject=subject), approval_id)
        assert r.status_code == 200, r.text
    state = (await h.client.get(f"/v1/approvals/{approval_id}", headers=program)).json()
    assert state["status"] == "pending"  # the program's one approver would have sufficed
    r = await review(h, await h.headers(tenant, "security", subject="sec-a"), approval_id)
    assert r.status_code == 200 and r.json()["status"] == "approved", r.text
    state = (await h.client.get(f"/v1/approvals/{approval_id}", headers=program)).json()
    token = state["permit"]["token"]

    # bound to the context hash: another context is refused; redeemed once
    other = await _redeem(h, program, token, {**DEPLOY, "service": "ledger"})
    assert other.json()["code"] == "args_mismatch"
    assert (await _redeem(h, program, token, DEPLOY)).status_code == 200
    again = await _redeem(h, program, token, DEPLOY)
    assert again.json()["code"] == "already_redeemed"

    async with h.db.read() as conn:
        bodies = (await conn.execute(select(audit_events.c.body).where(
            audit_events.c.tenant == tenant, audit_events.c.type == "barrier.opened"))
        ).scalars().all()
    assert len(bodies) == 1 and "rotate-at-dawn" not in bodies[0]
    payload = json.loads(bodies[0])["payload"]
    assert payload["requested"]["require"] == [{"role": "finance", "count": 1}]
    assert payload["effective"]["timeout_ms"] == 60000


async def test_a_stricter_barrier_keeps_what_is_stricter(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    h = await _harness(harness_factory, tmp_path)
    program = await h.headers(tenant, "runtime", "barrier")
    resp = await h.client.post("/v1/approvals", headers=program, json=barrier(
        DEPLOY, require=[{"role": "finance", "count": 3}, {"role": "legal", "count": 1}],
        timeout_ms=30_000, distinct_from="initiator_and_previous"))
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["require"] == [{"role": "finance", "count": 3}, {"role": "legal", "count": 1},
                               {"role": "security", "count": 1}]
    assert body["barrier"]["effective"]["timeout_ms"] == 30_000
    # a policy that allows the barrier keeps the program's requirement as asked
    plain = await h.client.post("/v1/approvals", headers=program,
                                json=barrier({"kind": "note"}))
    assert plain.json()["barrier"]["raised"] is False
    assert plain.json()["require"] == [{"role": "finance", "count": 1}]


async def test_only_the_barrier_role_opens_barriers_and_no_decision_mints_their_permit(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    h = await _harness(harness_factory, tmp_path)
    agent = await h.headers(tenant, "runtime")
    refused = await h.client.post("/v1/approvals", headers=agent, json=barrier(DEPLOY))
    assert refused.status_code == 403
    # an agent cannot get a permit for the barrier tool through decide either
    laundered = await h.client.post("/v1/decisions", headers=agent, json=decision_request(
        tool={"name": "cosigner.barrier"}, args=DEPLOY))
    assert laundered.status_code == 422 and laundered.json()["code"] == "reserved_tool"
    program = await h.headers(tenant, "barrier")
    denied = await h.client.post("/v1/approvals", headers=program,
                                 json=barrier({"forbidden": True}))
    assert denied.status_code == 403 and denied.json()["code"] == "barrier_denied"
    bad = await h.client.post("/v1/approvals", headers=program, json=barrier(
        DEPLOY, require=[{"role": "runtime", "count": 1}]))
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_requirement"
    async with h.db.read() as conn:
        types = (await conn.execute(select(audit_events.c.type).where(
            audit_events.c.tenant == tenant, audit_events.c.type.like("barrier.%")))
        ).scalars().all()
    assert types == ["barrier.refused"]


async def test_the_program_never_approves_its_own_barrier(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    """K13 on the barrier path: the opener is refused even when it names another
    initiator and holds the required role."""
    h = await _harness(harness_factory, tmp_path)
    program = await h.headers(tenant, "runtime", "barrier", "finance", subject="ops-bot")
    body = {**barrier({"kind": "note"}), "initiator": {"id": "someone-else"}}
    opened = (await h.client.post("/v1/approvals", headers=program, json=body)).json()
    refused = await review(h, program, opened["id"])
    assert refused.status_code == 403 and refused.json()["code"] == "self_approval"
