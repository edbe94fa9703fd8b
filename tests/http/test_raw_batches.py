"""The require_approval decision and the redeem run their batch work on SQLite's own
driver (RawWork, issue 20 session 5): same answers, same rows, same chained events as the
SQLAlchemy way, which still serves every case the raw twin hands back (NeedsCore)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.db.batch import NeedsCore
from cosigner.db.tables import audit_events, permits
from cosigner.decisions.plan import DecisionPlan
from cosigner.permits import redeem as redeem_module
from tests.conftest import Harness, decision_request
from tests.http.approval_helpers import decide, redeem, refund_args
from tests.http.raw_rows import chain_holds, same, written


async def test_require_approval_raw_writes_what_the_sqlalchemy_way_writes(
        harness: Harness, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = await harness.headers(tenant, "runtime")
    ran: list[str] = []
    real = DecisionPlan.apply_raw

    def spy(self: DecisionPlan, raw: Any, dialect: Any) -> Any:
        ran.append("raw")
        return real(self, raw, dialect)

    monkeypatch.setattr(DecisionPlan, "apply_raw", spy)
    body = decision_request(run={"id": "run-raw"}, args=refund_args(150_000))
    by_raw = await decide(harness, runtime, body)
    assert ran == (["raw"] if harness.db.is_sqlite else [])

    def hand_back(self: DecisionPlan, raw: Any, dialect: Any) -> Any:
        raise NeedsCore

    monkeypatch.setattr(DecisionPlan, "apply_raw", hand_back)
    by_core = await decide(harness, runtime, decision_request(
        run={"id": "run-core"}, args=refund_args(150_000)))
    assert by_raw["effect"] == by_core["effect"] == "require_approval"
    assert same(by_raw) == same(by_core)
    assert by_raw["approval"]["review_url"].endswith(by_raw["approval"]["id"])
    raw_rows = await written(harness, tenant, by_raw["decision_id"])
    core_rows = await written(harness, tenant, by_core["decision_id"])
    assert [t for t, _ in raw_rows["events"]] == ["decision.made", "approval.requested"]
    assert raw_rows == core_rows
    # The same call again joins the pending request (the raw twin hands it back).
    monkeypatch.setattr(DecisionPlan, "apply_raw", real)
    again = await decide(harness, runtime, {**body, "request_id": "req-again"})
    assert again["approval"]["id"] == by_raw["approval"]["id"]
    await chain_holds(harness, tenant)


async def test_redeem_raw_is_single_use_and_logged(harness: Harness, tenant: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = await harness.headers(tenant, "runtime")
    ran: list[int] = []
    real = redeem_module._REDEEM_UNLESS_REJECTED_RAW

    class Spy:
        def run(self, conn: Any, dialect: Any, values: Any) -> Any:
            out = real.run(conn, dialect, values)
            ran.append(out[1])
            return out

    monkeypatch.setattr(redeem_module, "_REDEEM_UNLESS_REJECTED_RAW", Spy())
    tokens = await _permits(harness, runtime, 3, "run")
    args = decision_request()["args"]
    answers = await asyncio.gather(*(redeem(harness, runtime, token, "issue_refund", args)
                                     for token in tokens for _ in range(4)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [200] * 3 + [409] * 9, [a.text for a in answers]
    assert {a.json()["code"] for a in answers if a.status_code == 409} == {
        "already_redeemed"}
    states, kinds = await _permit_outcomes(harness, tenant)
    assert sorted(states) == ["redeemed"] * 3
    assert sorted(kinds) == ["permit.redeemed"] * 3 + ["permit.refused"] * 9
    await chain_holds(harness, tenant)
    if harness.db.is_sqlite:  # the single-use UPDATE ran on the driver, rowcount 1 or 0
        assert sorted(ran) == [0] * 9 + [1] * 3
    else:
        assert ran == []


async def test_review_needs_core_after_a_raw_redeem_keeps_single_use(
        harness_factory: Any, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review (session 5): one redeem of a batch ran its single-use UPDATE on the driver,
    then a later item of the same batch hands the batch back (NeedsCore). The raw
    transaction is rolled back and the batch runs again the SQLAlchemy way: each permit is
    redeemed once, one ``permit.redeemed`` event each, no refusal, the chain holds."""
    harness = await harness_factory(log_batch_wait_ms=100)
    runtime = await harness.headers(tenant, "runtime")
    real = redeem_module._STANDING_REJECTION_RAW
    handed_back: list[str] = []

    real_update = redeem_module._REDEEM_UNLESS_REJECTED_RAW
    order: list[str] = []

    class Spy:
        def run(self, conn: Any, dialect: Any, values: Any) -> Any:
            if values["run_id"] == "run-nc-1":  # pretend a rejection raced this one
                handed_back.append(values["run_id"])
                order.append("needs-core")
                return [("a-raced",)], 1
            return real.run(conn, dialect, values)

    class UpdateSpy:
        def run(self, conn: Any, dialect: Any, values: Any) -> Any:
            if values["run_id"] == "run-nc-1":  # the raced rejection: nothing changes
                return [], 0
            out = real_update.run(conn, dialect, values)
            order.append(f"update:{out[1]}")
            return out

    monkeypatch.setattr(redeem_module, "_STANDING_REJECTION_RAW", Spy())
    monkeypatch.setattr(redeem_module, "_REDEEM_UNLESS_REJECTED_RAW", UpdateSpy())
    tokens = await _permits(harness, runtime, 2, "run-nc")
    args = decision_request()["args"]
    before = harness.context.log_writer.stats.batches
    # As if other writes were in flight: the first redeem's batch gathers (a lone write
    # would commit at once, cosigner.db.group_commit).
    harness.context.log_writer._siblings = True
    first = asyncio.ensure_future(redeem(harness, runtime, tokens[0], "issue_refund", args))
    await asyncio.sleep(0.01)  # the first redeem queued first, in the same gathering batch
    answers = [await redeem(harness, runtime, tokens[1], "issue_refund", args), await first]
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    states, kinds = await _permit_outcomes(harness, tenant)
    assert sorted(states) == ["redeemed"] * 2
    assert sorted(kinds) == ["permit.redeemed"] * 2
    await chain_holds(harness, tenant)
    if harness.db.is_sqlite:  # the UPDATE ran raw, then the batch was handed back
        assert order == ["update:1", "needs-core"], order
        assert harness.context.log_writer.stats.batches - before == 1  # one batch


async def _permit_outcomes(harness: Any, tenant: str) -> tuple[list[str], list[str]]:
    """``tenant``'s permit statuses and its ``permit.re…`` event types."""
    async with harness.db.read() as conn:
        states = (await conn.execute(select(permits.c.status).where(
            permits.c.tenant == tenant))).scalars().all()
        kinds = (await conn.execute(select(audit_events.c.type).where(
            audit_events.c.tenant == tenant, audit_events.c.type.like("permit.re%"))
        )).scalars().all()
    return list(states), list(kinds)


async def _permits(harness: Any, runtime: dict[str, str], count: int, run: str) -> list[str]:
    """``count`` allowed decisions' permit tokens, each in its own run ``{run}-{i}``."""
    tokens = []
    for i in range(count):
        made = await decide(harness, runtime, decision_request(run={"id": f"{run}-{i}"}))
        tokens.append(made["permit"]["token"])
    return tokens
