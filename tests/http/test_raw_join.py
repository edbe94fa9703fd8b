"""A require_approval decision that joins the pending request of its call runs on SQLite's
own driver (issue 20 session 13): the same answer, rows and chained events as the
SQLAlchemy way, which still decides every case the raw join hands back (a due twin to
expire or escalate, a twin gone, a standing rejection). PostgreSQL joins the SQLAlchemy
way (its raw batch path, cosigner.db.raw_pg, covers prepared writes only)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.approvals import joining, opening
from cosigner.core.clock import FrozenClock
from cosigner.db.batch import NeedsCore
from cosigner.db.tables import audit_events
from cosigner.decisions.plan import DecisionPlan
from tests.conftest import Harness
from tests.http.approval_helpers import decide, needs, review, scripted, scripted_harness
from tests.http.raw_rows import chain_holds, last_events, same, written
from tests.http.test_approval_escalation import escalating

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


class Ways:
    """Which way each decision's batch work ran: ``core`` (DecisionPlan.apply, the
    SQLAlchemy way), ``join_raw`` (the raw join); ``force_core`` hands every raw attempt
    back (NeedsCore), as the code before session 13 did for a join."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ran: list[str] = []
        self.force_core = False
        apply, apply_raw, join_raw = DecisionPlan.apply, DecisionPlan.apply_raw, opening.join_raw

        async def core(plan: DecisionPlan, conn: Any) -> Any:
            self.ran.append("core")
            return await apply(plan, conn)

        def raw(plan: DecisionPlan, conn: Any, dialect: Any) -> Any:
            if self.force_core:
                raise NeedsCore
            return apply_raw(plan, conn, dialect)

        def join(*args: Any, **kwargs: Any) -> Any:
            self.ran.append("join_raw")
            return join_raw(*args, **kwargs)

        monkeypatch.setattr(DecisionPlan, "apply", core)
        monkeypatch.setattr(DecisionPlan, "apply_raw", raw)
        monkeypatch.setattr(opening, "join_raw", join)

    def take(self) -> list[str]:
        ran, self.ran = self.ran, []
        return ran


@pytest.fixture
async def sh(harness_factory: Callable[..., Any], tmp_path: Path) -> Harness:
    return await scripted_harness(harness_factory, tmp_path, log_batch_wait_ms=50)


async def _types(h: Harness, tenant: str) -> list[str]:
    async with h.db.read() as conn:
        return list((await conn.execute(select(audit_events.c.type).where(
            audit_events.c.tenant == tenant).order_by(audit_events.c.seq))).scalars())


async def test_a_join_runs_raw_and_writes_what_the_sqlalchemy_join_writes(
        sh: Harness, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = await sh.headers(tenant, "runtime")
    carol = await sh.headers(tenant, "finance", subject="carol")
    ways = Ways(monkeypatch)
    answers, events = {}, {}
    for way in ("raw", "core"):
        ways.force_core = way == "core"
        body = scripted(needs(("finance", 2)), run=f"run-{way}")
        first = await decide(sh, runtime, body)
        assert (await review(sh, carol, first["approval"]["id"])).status_code == 200  # 1 of 2
        ways.take()
        answers[way] = await decide(sh, runtime, {**body, "request_id": f"again-{way}"})
        events[way] = await last_events(sh, tenant, 2)
        assert answers[way]["approval"]["id"] == first["approval"]["id"]
        assert answers[way]["approval"]["progress"] == [
            {"role": "finance", "count": 2, "approved": 1}]
        if way == "core" or not sh.db.is_sqlite:
            assert ways.take() == ["core"]
        else:
            assert ways.take() == ["join_raw"]  # and never DecisionPlan.apply
    assert same(answers["raw"]) == same(answers["core"])
    by_raw = await written(sh, tenant, answers["raw"]["decision_id"])
    by_core = await written(sh, tenant, answers["core"]["decision_id"])
    assert [t for t, _ in events["raw"]] == ["decision.made", "approval.joined"]
    assert events["raw"] == events["core"]
    assert by_raw["approvals"] == []  # a join opens nothing
    assert by_raw == by_core
    await chain_holds(sh, tenant)


async def test_one_batch_opens_once_and_joins_the_rest(
        sh: Harness, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = await sh.headers(tenant, "runtime")
    ways = Ways(monkeypatch)
    body = scripted(needs(("finance", 1)), run="run-batch")
    answers = await asyncio.gather(*(decide(sh, runtime, {**body, "request_id": f"req-{i}"})
                                     for i in range(8)))
    assert len({a["approval"]["id"] for a in answers}) == 1
    types = await _types(sh, tenant)
    assert (types.count("approval.requested"), types.count("approval.joined")) == (1, 7)
    if sh.db.is_sqlite:
        assert ways.take().count("core") == 0
    await chain_holds(sh, tenant)


@pytest.fixture
async def clocked(harness_factory: Callable[..., Any], tmp_path: Path
                  ) -> tuple[Harness, FrozenClock]:
    clock = FrozenClock(T0)
    return await scripted_harness(harness_factory, tmp_path, clock=clock), clock


async def test_a_due_twin_is_expired_and_a_new_request_opened_the_sqlalchemy_way(
        clocked: tuple[Harness, FrozenClock], tenant: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    ways = Ways(monkeypatch)
    body = scripted(needs(("finance", 1), timeout_ms=1_000))
    first = await decide(h, runtime, body)
    clock.advance(seconds=1)  # now == expires_at: expiry wins
    ways.take()
    second = await decide(h, runtime, {**body, "request_id": "retry"})
    # Handed back by the raw join (PostgreSQL: the SQLAlchemy way from the start).
    assert ways.take() == (["join_raw", "core"] if h.db.is_sqlite else ["core"])
    assert second["approval"]["id"] != first["approval"]["id"]
    assert second["approval"]["status"] == "pending"
    types = await _types(h, tenant)
    assert types[-3:] == ["decision.made", "approval.expired", "approval.requested"]
    await chain_holds(h, tenant)


async def test_an_escalated_twin_is_joined_at_its_second_stage(
        clocked: tuple[Harness, FrozenClock], tenant: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    carol = await h.headers(tenant, "finance", subject="carol")
    ways = Ways(monkeypatch)
    body = scripted(escalating(finance=2))  # finance ×2 (60 s), then manager (60 s)
    first = await decide(h, runtime, body)
    assert (await review(h, carol, first["approval"]["id"])).status_code == 200
    clock.advance(seconds=60)  # stage 1 is over: the join escalates it first (core)
    ways.take()
    escalated = await decide(h, runtime, {**body, "request_id": "at-stage-2"})
    assert ways.take() == (["join_raw", "core"] if h.db.is_sqlite else ["core"])
    again = await decide(h, runtime, {**body, "request_id": "again-at-stage-2"})
    assert ways.take() == (["join_raw"] if h.db.is_sqlite else ["core"])
    for joined in (escalated, again):
        assert joined["approval"]["id"] == first["approval"]["id"]
        assert joined["approval"]["progress"] == [
            {"role": "manager", "count": 1, "approved": 0}]  # carol's stage-1 review
    assert same(escalated) == same(again)
    types = await _types(h, tenant)
    assert types.count("approval.escalated") == 1 and types.count("approval.joined") == 2
    await chain_holds(h, tenant)


@pytest.mark.parametrize("verdict", ["approved", "rejected"])
async def test_a_twin_decided_before_the_write_is_not_joined(
        sh: Harness, tenant: str, monkeypatch: pytest.MonkeyPatch, verdict: str) -> None:
    """Approved: the same call again opens a new request (on the driver). Rejected: it is
    denied (a standing rejection, decided the SQLAlchemy way)."""
    runtime = await sh.headers(tenant, "runtime")
    carol = await sh.headers(tenant, "finance", subject="carol")
    ways = Ways(monkeypatch)
    body = scripted(needs(("finance", 1)), run=f"run-{verdict}")
    first = await decide(sh, runtime, body)
    resp = await review(sh, carol, first["approval"]["id"], decision=verdict)
    assert resp.json()["status"] == verdict
    ways.take()
    second = await decide(sh, runtime, {**body, "request_id": f"after-{verdict}"})
    if verdict == "rejected":
        assert (second["effect"], second["approval"]) == ("deny", None)
        assert ways.take() == ["core"]
    else:
        assert second["approval"]["id"] != first["approval"]["id"]
        assert second["approval"]["status"] == "pending"
        assert ways.take() == ([] if sh.db.is_sqlite else ["core"])  # opened raw, no join
        events = (await written(sh, tenant, second["decision_id"]))["events"]
        assert [t for t, _ in events] == ["decision.made", "approval.requested"]
    await chain_holds(sh, tenant)


async def test_a_twin_gone_after_the_insert_is_joined_the_sqlalchemy_way(
        sh: Harness, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The raw join hands back a twin its read does not find (the insert found it pending
    in the same transaction, so only a fault could do this): the SQLAlchemy way decides."""
    runtime = await sh.headers(tenant, "runtime")
    ways = Ways(monkeypatch)
    body = scripted(needs(("finance", 1)), run="run-gone")
    first = await decide(sh, runtime, body)

    class Gone:
        def run(self, conn: Any, dialect: Any, values: Any) -> Any:
            return [], 0

    monkeypatch.setattr(joining, "_PENDING_TWIN_RAW", Gone())
    ways.take()
    second = await decide(sh, runtime, {**body, "request_id": "twin-gone"})
    assert ways.take() == (["join_raw", "core"] if sh.db.is_sqlite else ["core"])
    assert second["approval"]["id"] == first["approval"]["id"]
    types = await _types(sh, tenant)
    assert (types.count("approval.requested"), types.count("approval.joined")) == (1, 1)
    await chain_holds(sh, tenant)
