"""Break-glass (issue 18): one ``breakglass`` principal (made by the CLI) authorises a
pending request alone with a reason; the permit is flagged, every approver role is notified
at once, and the after-the-fact review stays open and listed until an approver records it.
Refused where the policy forbids it, for denied calls, and for the requesting side (K13)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from cosigner.core.clock import FrozenClock
from cosigner.db.tables import audit_events
from cosigner.db.tables_web import webhook_deliveries
from tests.conftest import ROOT, TEST_KEK, Harness
from tests.http.approval_helpers import (
    decide,
    needs,
    redeem,
    review,
    scripted,
    state,
    write_scripted_bundle,
)

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
REASON = "payment processor outage, customer refund must go out now"
ESCALATING = {"effect": "require_approval", "reasons": ["scripted"], "approval": {
    "require": [{"role": "finance", "count": 2}], "timeout_ms": 60_000,
    "distinct_from": "initiator",
    "on_expired": {"require": [{"role": "manager", "count": 1}], "timeout_ms": 60_000,
                   "distinct_from": "initiator"}}}


@pytest.fixture
async def bh(harness_factory: Callable[..., Any], tmp_path: Path, tenant: str
             ) -> tuple[Harness, FrozenClock]:
    clock = FrozenClock(T0)
    h: Harness = await harness_factory(
        clock=clock, bundle_dirs=[write_scripted_bundle(tmp_path / "b")],
        webhooks={tenant: [{"url": "http://127.0.0.1:9/hook",
                            "secret": "whsec-0123456789abcdef"}]})
    await h.tasks.webhook_worker.stop_loop()  # deliveries stay queued: the test reads them
    return h, clock


def cli_key(h: Harness, tenant: str, *roles: str, subject: str) -> dict[str, str]:
    """An API key made by ``cosigner principals add-key`` (the real CLI, another process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSIGNER_")}
    env.update(COSIGNER_DATABASE_URL=h.settings.database_url,
               COSIGNER_KEY_ENCRYPTION_KEY=TEST_KEK)
    role_args = [arg for role in roles for arg in ("--role", role)]
    done = subprocess.run(
        [sys.executable, "-m", "cosigner", "principals", "add-key", "--tenant", tenant,
         *role_args, "--subject", subject],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return {"Authorization": f"Bearer {done.stdout.strip().splitlines()[-1]}"}


async def break_glass(h: Harness, headers: dict[str, str], approval_id: str,
                      reason: str = REASON) -> httpx.Response:
    return await h.client.post(f"/v1/approvals/{approval_id}/break-glass", headers=headers,
                               json={"reason": reason})


def claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


async def event_types(h: Harness, tenant: str) -> list[str]:
    async with h.db.read() as conn:
        return list((await conn.execute(select(audit_events.c.type).where(
            audit_events.c.tenant == tenant).order_by(audit_events.c.seq))).scalars())


async def test_break_glass_mints_notifies_and_opens_the_after_review(
        bh: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, _ = bh
    runtime = await h.headers(tenant, "runtime")
    eve = cli_key(h, tenant, "breakglass", subject="eve")
    alice = await h.headers(tenant, "finance", subject="alice")
    body = scripted(ESCALATING)
    approval_id = (await decide(h, runtime, body))["approval"]["id"]
    short = await break_glass(h, eve, approval_id, reason="urgent")
    assert (short.status_code, short.json()["code"]) == (422, "reason_too_short")
    resp = await break_glass(h, eve, approval_id)
    assert resp.status_code == 200, resp.text
    done = resp.json()
    assert done["status"] == "approved" and done["after_review"] == "open"
    assert done["break_glass"]["by"]["subject"] == "eve" and done["break_glass"]["reason"] == REASON
    token = (await state(h, runtime, approval_id))["permit"]["token"]
    assert claims(token)["break_glass"] is True
    assert claims(token)["approvers"][0]["role"] == "breakglass"
    assert (await redeem(h, runtime, token, "delete_file", body["args"])).status_code == 200
    async with h.db.read() as conn:
        hooks = [json.loads(r.body) for r in (await conn.execute(select(webhook_deliveries)
                 .where(webhook_deliveries.c.tenant == tenant))).all()]
    sent = [d["approval"] for d in hooks if d["type"] == "approval.break_glass"]
    assert len(sent) == 1 and sent[0]["notify_roles"] == ["finance", "manager"]
    assert sent[0]["break_glass"]["reason"] == REASON
    listed = await h.client.get("/v1/approvals", headers=alice,
                                params={"status": "after_review"})
    assert [i["id"] for i in listed.json()["items"]] == [approval_id]
    url = f"/v1/approvals/{approval_id}/after-review"
    resp = await h.client.post(url, headers=alice, json={"verdict": "upheld",
                                                         "comment": "outage confirmed"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["after_review"] == "done"
    assert resp.json()["after_reviewed"]["by"]["subject"] == "alice"
    again = await h.client.post(url, headers=alice, json={"verdict": "upheld", "comment": "x"})
    assert (again.status_code, again.json()["code"]) == (409, "no_after_review")
    listed = await h.client.get("/v1/approvals", headers=alice,
                                params={"status": "after_review"})
    assert listed.json()["items"] == []
    types = await event_types(h, tenant)
    assert types.count("approval.break_glass") == 1 and types.count("approval.after_reviewed") == 1


async def test_the_break_glass_principal_cannot_review_itself(
        bh: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, _ = bh
    runtime = await h.headers(tenant, "runtime")
    eve = await h.headers(tenant, "breakglass", "finance", subject="eve")
    approval_id = (await decide(h, runtime, scripted(ESCALATING)))["approval"]["id"]
    assert (await break_glass(h, eve, approval_id)).status_code == 200
    resp = await h.client.post(f"/v1/approvals/{approval_id}/after-review", headers=eve,
                               json={"verdict": "upheld", "comment": "fine by me"})
    assert (resp.status_code, resp.json()["code"]) == (403, "self_approval")


async def test_refused_where_the_policy_forbids_it(bh: tuple[Harness, FrozenClock],
                                                  tenant: str) -> None:
    h, _ = bh
    runtime = await h.headers(tenant, "runtime")
    eve = await h.headers(tenant, "breakglass", subject="eve")
    result = needs(("finance", 1))
    result["approval"]["break_glass"] = False
    approval_id = (await decide(h, runtime, scripted(result)))["approval"]["id"]
    resp = await break_glass(h, eve, approval_id)
    assert (resp.status_code, resp.json()["code"]) == (403, "break_glass_forbidden")
    assert (await state(h, runtime, approval_id))["status"] == "pending"
    assert "approval.break_glass_refused" in await event_types(h, tenant)


async def test_forbidden_break_glass_holds_for_every_stage(
        bh: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, clock = bh
    runtime = await h.headers(tenant, "runtime")
    eve = await h.headers(tenant, "breakglass", subject="eve")
    result = json.loads(json.dumps(ESCALATING))
    result["approval"]["break_glass"] = False
    approval_id = (await decide(h, runtime, scripted(result)))["approval"]["id"]
    clock.advance(seconds=60)  # escalated at this instant
    resp = await break_glass(h, eve, approval_id)
    assert (resp.status_code, resp.json()["code"]) == (403, "break_glass_forbidden")
    assert (await state(h, runtime, approval_id))["stage"] == 2
    async with h.db.read() as conn:  # the new stage's approvers were notified
        types = (await conn.execute(select(webhook_deliveries.c.event_type).where(
            webhook_deliveries.c.tenant == tenant))).scalars().all()
    assert sorted(types) == ["approval.escalated", "approval.pending"]


async def test_never_for_a_denied_or_rejected_call(bh: tuple[Harness, FrozenClock],
                                                   tenant: str) -> None:
    h, _ = bh
    runtime = await h.headers(tenant, "runtime")
    eve = await h.headers(tenant, "breakglass", subject="eve")
    alice = await h.headers(tenant, "finance", subject="alice")
    denied = await decide(h, runtime, scripted({"effect": "deny", "reasons": ["no"]}))
    assert denied["approval"] is None
    resp = await break_glass(h, eve, denied["decision_id"])  # no request exists
    assert resp.status_code == 404
    body = scripted(needs(("finance", 1)))
    approval_id = (await decide(h, runtime, body))["approval"]["id"]
    assert (await review(h, alice, approval_id, "rejected", "no")).status_code == 200
    resp = await break_glass(h, eve, approval_id)
    assert (resp.status_code, resp.json()["code"]) == (409, "approval_not_pending")
    retry = await decide(h, runtime, {**body, "request_id": "again"})
    assert retry["effect"] == "deny" and retry["approval"] is None  # nothing to break open


async def test_k13_never_for_the_requesting_side_or_without_the_role(
        bh: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, clock = bh
    opener = await h.headers(tenant, "runtime", "breakglass", subject="ops-bot")
    initiator = await h.headers(tenant, "breakglass", subject="Agent-Support")
    alice = await h.headers(tenant, "finance", subject="alice")
    approval_id = (await decide(h, opener, scripted(needs(("finance", 1)))))["approval"]["id"]
    for who in (opener, initiator):
        resp = await break_glass(h, who, approval_id)
        assert (resp.status_code, resp.json()["code"]) == (403, "self_approval")
    resp = await break_glass(h, alice, approval_id)
    assert (resp.status_code, resp.json()["code"]) == (403, "forbidden")
    resp = await h.client.post(f"/v1/approvals/{approval_id}/break-glass",
                               headers=await h.headers(tenant, "breakglass", subject="eve"),
                               json={"reason": REASON, "requested_by": "eve"})
    assert resp.status_code == 422  # identity never from the body
    clock.advance(seconds=600)  # expiry wins
    resp = await break_glass(h, await h.headers(tenant, "breakglass", subject="eve"),
                             approval_id)
    assert (resp.status_code, resp.json()["code"]) == (409, "approval_expired")
