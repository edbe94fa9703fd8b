"""Client site modes ``off | shadow | on`` against a live ``cosigner serve`` (issue 18):
shadow asks, records the decision as ``mode: shadow``, always runs the tool and never gets
a redeemable permit; off runs the tool without asking and records nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from cosigner_client import AsyncGate, Gate
from sqlalchemy import func, select

from cosigner.db.database import Database
from cosigner.db.tables import audit_events, permits
from cosigner.db.tables_approvals import approvals
from tests.client.conftest import ACTORS, REFUND, Live
from tests.client.test_gate import ORDER, Tool
from tests.conftest import free_port

DENIED = {**REFUND, "amount_minor": 250000}


def _rows(database_url: str, tenant: str) -> dict[str, int]:
    async def run() -> dict[str, int]:
        db = Database(database_url)
        try:
            async with db.read() as conn:
                return {t.name: (await conn.execute(
                    select(func.count()).select_from(t).where(t.c.tenant == tenant)
                )).scalar_one() for t in (audit_events, permits, approvals)}
        finally:
            await db.dispose()
    return asyncio.run(run())


def _get(live: Live, path: str, key: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{live.url}{path}", params=params, timeout=10,
                     headers={"Authorization": f"Bearer {key}"})


def test_shadow_runs_the_tool_and_never_produces_a_redeemable_permit(
        live: Live, shared_server: tuple[str, str]) -> None:
    _, database_url = shared_server
    tools = {name: Tool(name) for name in ("get_order", "issue_refund", "refund_big")}
    with Gate(live.url, live.runtime, run="run-shadow", mode="shadow", **ACTORS) as g:
        allowed = g.call("get_order", ORDER, tools["get_order"], side_effect="read")
        review = g.call("issue_refund", REFUND, tools["issue_refund"])
        denied = g.call("issue_refund", DENIED, tools["refund_big"])
    # the tool ran every time; the result says what would have happened
    assert [r.status for r in (allowed, review, denied)] == ["shadow"] * 3
    assert all(len(t.calls) == 1 for t in tools.values())
    assert (allowed.decision.effect, review.decision.effect, denied.decision.effect) == (
        "allow", "require_approval", "deny")
    assert allowed.value == "get_order" and allowed.unwrap() == "get_order"
    # no permit, no approval request: nothing anyone could redeem or approve
    assert all(r.decision.permit is None and r.decision.approval is None
               for r in (allowed, review, denied))
    rows = _rows(database_url, live.tenant)
    assert (rows["permits"], rows["approvals"]) == (0, 0)
    # asking for a review of the shadow allow cannot turn it into a permit either
    resp = httpx.post(f"{live.url}/v1/approvals", timeout=10,
                      headers={"Authorization": f"Bearer {live.runtime}"},
                      json={"decision_id": allowed.decision.decision_id, "reason": "check"})
    assert resp.status_code == 422 and resp.json()["code"] == "shadow_decision"
    assert _rows(database_url, live.tenant)["permits"] == 0
    # the server reports shadow decisions separately
    shadow = _get(live, "/v1/audit/events", live.auditor, mode="shadow").json()["events"]
    assert sorted(e["subject"]["decision_id"] for e in shadow) == sorted(
        r.decision.decision_id for r in (allowed, review, denied))
    assert all(e["type"] == "decision.made" and e["payload"]["mode"] == "shadow"
               for e in shadow)


def test_a_shadow_decision_differs_from_an_enforced_one(live: Live) -> None:
    """The same call with mode on gets its permit: only shadow withholds it."""
    with Gate(live.url, live.runtime, run="run-on", mode="shadow",
              modes={"get_order": "on"}, **ACTORS) as g:
        on = g.call("get_order", ORDER, Tool(), side_effect="read")
        shadow = g.call("get_order", ORDER, Tool(), side_effect="read", mode="shadow")
    assert on.status == "executed" and on.redemption is not None and on.redemption.ok
    assert shadow.status == "shadow" and shadow.redemption is None
    enforced = _get(live, "/v1/audit/events", live.auditor, mode="shadow").json()["events"]
    assert [e["subject"]["decision_id"] for e in enforced] == [shadow.decision.decision_id]


def test_off_runs_the_tool_and_makes_no_call(live: Live,
                                             shared_server: tuple[str, str]) -> None:
    _, database_url = shared_server
    before = _rows(database_url, live.tenant)  # the keys' own events
    tool = Tool("ran")
    with Gate(live.url, live.runtime, run="run-off", modes={"issue_refund": "off"},
              **ACTORS) as g:
        result = g.call("issue_refund", DENIED, tool)
    assert result.status == "off" and result.value == "ran" and tool.calls == [DENIED]
    assert _rows(database_url, live.tenant) == before
    # nothing listens on this port: mode off never tries to connect
    dead = f"http://127.0.0.1:{free_port()}"
    with Gate(dead, live.runtime, run="run-dead", mode="off", timeout=0.5, **ACTORS) as g:
        assert g.call("issue_refund", DENIED, Tool("x")).unwrap() == "x"
        # mode on against the same dead server fails closed
        assert g.call("issue_refund", DENIED, Tool(), mode="on").status == "denied"


async def test_async_gate_shadow_and_off(live: Live) -> None:
    async def tool(**args: Any) -> str:
        return "async"

    async with AsyncGate(live.url, live.runtime, run="run-async", mode="shadow",
                         modes={"get_order": "off"}, **ACTORS) as g:
        shadow = await g.call("issue_refund", DENIED, tool)
        off = await g.call("get_order", ORDER, tool)
    assert (shadow.status, shadow.decision.effect, shadow.value) == ("shadow", "deny",
                                                                     "async")
    assert (off.status, off.value) == ("off", "async")


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError):
        Gate("http://127.0.0.1:1", "k", mode="audit")  # type: ignore[arg-type]


def test_shadow_reports_a_reviewers_rejection_of_the_same_call(live: Live) -> None:
    """What would have happened includes a standing rejection in the run."""
    with Gate(live.url, live.runtime, run="run-rejected", **ACTORS) as g:
        asked = g.decide("issue_refund", REFUND)
        assert asked.approval is not None
        assert live.review(asked.approval.id, "rejected").status_code == 200
        shadow = g.call("issue_refund", REFUND, Tool("ran"), mode="shadow")
    assert shadow.status == "shadow" and shadow.value == "ran"
    assert (shadow.decision.effect, shadow.decision.reason) == ("deny",
                                                                "rejected_by_reviewer")
