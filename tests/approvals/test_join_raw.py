"""Joining a pending approval request on the raw driver (cosigner.approvals.joining, issue
20 session 13) answers and records exactly what ``open_request`` joining through
SQLAlchemy does: the same brief approval object and the same ``approval.joined`` event,
for a fresh twin, one with an approval of a quorum of two counted, and one escalated to its
second stage (whose first-stage review no longer counts). A due twin is handed back
(NeedsCore) with nothing written. The raw transaction exists on a SQLite file only."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.approvals.opening import CallFacts, open_request, open_request_raw
from cosigner.audit.events import stored_bytes
from cosigner.core.canonical import canonicalize
from cosigner.core.clock import FrozenClock
from cosigner.db.batch import NeedsCore
from cosigner.db.raw_transaction import raw_transaction
from cosigner.db.tables_approvals import approvals
from cosigner.policy.result import parse_requirement
from tests.conftest import Harness
from tests.http.approval_helpers import (
    decide,
    needs,
    review,
    scripted,
    scripted_harness,
    state,
)
from tests.http.test_approval_escalation import escalating

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


class _Undo(Exception):
    """Raised inside a transaction to roll it back."""


@pytest.fixture
async def clocked(harness_factory: Callable[..., Any], tmp_path: Path
                  ) -> tuple[Harness, FrozenClock]:
    clock = FrozenClock(T0)
    h = await scripted_harness(harness_factory, tmp_path, clock=clock)
    if not h.db.is_sqlite:
        pytest.skip("the raw transaction is SQLite's (PostgreSQL joins through SQLAlchemy)")
    return h, clock


async def _twin(h: Harness, tenant: str, approval_id: str) -> Any:
    async with h.db.read() as conn:
        return (await conn.execute(select(approvals).where(
            approvals.c.tenant == tenant, approvals.c.id == approval_id))).one()


def _facts(twin: Any, decision_id: str) -> CallFacts:
    """The call of a second decision of ``twin``'s call."""
    return CallFacts(tenant=twin.tenant, decision_id=decision_id, run_id=twin.run_id,
                     tool=twin.tool, args={"path": "/tmp/a"}, args_hash=twin.args_hash,
                     mask=(), initiator=twin.initiator, principal=twin.principal,
                     policy=twin.policy, reasons=twin.reasons)


async def _both_ways(h: Harness, twin: Any, now: datetime,
                     result: dict[str, Any]) -> tuple[Any, Any]:
    """``(raw, core)``: what each way returns for one joining decision (whose policy
    result is ``result``, the twin's), each in a transaction rolled back afterwards."""
    facts, requirement = _facts(twin, str(uuid.uuid4())), parse_requirement(result["approval"])
    opened_by = {"subject": "second-runtime", "principal_id": None, "kind": "api_key"}
    got: dict[str, Any] = {}
    with pytest.raises(_Undo):
        async with raw_transaction(h.db) as raw:
            assert raw is not None
            got["raw"] = open_request_raw(raw, h.db.engine.dialect, h.settings, call=facts,
                                          requirement=requirement, opened_by=opened_by,
                                          now=now)
            raise _Undo
    with pytest.raises(_Undo):
        async with h.db.transaction() as conn:
            got["core"] = await open_request(conn, h.settings, call=facts,
                                             requirement=requirement, opened_by=opened_by,
                                             now=now)
            raise _Undo
    return got["raw"], got["core"]


def _bytes(value: Any, now: datetime) -> bytes:
    """The answer's canonical JSON and each event's chain body, as the log stores it."""
    brief, events = value
    return canonicalize(brief) + b"".join(
        stored_bytes(e, tenant="t", seq=7, time=now, prev_hash="0" * 64)[1] for e in events)


@pytest.mark.parametrize("scenario", ["fresh", "one_of_two", "second_stage"])
async def test_raw_join_returns_what_the_sqlalchemy_join_returns(
        clocked: tuple[Harness, FrozenClock], tenant: str, scenario: str) -> None:
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    carol = await h.headers(tenant, "finance", subject="carol")
    # Else finance ×2 (60 s), then manager (60 s).
    result = needs(("finance", 1)) if scenario == "fresh" else escalating(finance=2)
    approval_id = (await decide(h, runtime, scripted(result)))["approval"]["id"]
    if scenario != "fresh":
        assert (await review(h, carol, approval_id)).status_code == 200  # 1 of 2
    if scenario == "second_stage":
        clock.advance(seconds=60)
        assert (await state(h, runtime, approval_id))["stage"] == 2  # escalated on read
    twin = await _twin(h, tenant, approval_id)
    raw, core = await _both_ways(h, twin, clock(), result)
    assert raw == core
    assert _bytes(raw, clock()) == _bytes(core, clock())
    brief, events = raw
    assert brief["id"] == approval_id and brief["status"] == "pending"
    assert [e.type for e in events] == ["approval.joined"]
    approved = {"fresh": 0, "one_of_two": 1, "second_stage": 0}[scenario]
    assert [g["approved"] for g in brief["progress"]] == [approved]
    # Nothing of either attempt stayed: the twin is as it was.
    assert await _twin(h, tenant, approval_id) == twin


async def test_a_due_twin_is_handed_back_with_nothing_written(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    approval_id = (await decide(h, runtime, scripted(needs(("finance", 1),
                                                           timeout_ms=1_000))))["approval"]["id"]
    twin = await _twin(h, tenant, approval_id)
    clock.advance(seconds=1)  # now == expires_at: expiry wins, the core path expires it
    with pytest.raises(NeedsCore):
        async with raw_transaction(h.db) as raw:
            assert raw is not None
            open_request_raw(raw, h.db.engine.dialect, h.settings,
                             call=_facts(twin, str(uuid.uuid4())),
                             requirement=parse_requirement(twin.requirement),
                             opened_by={"subject": "s", "principal_id": None,
                                        "kind": "api_key"}, now=clock())
    assert await _twin(h, tenant, approval_id) == twin
    assert clock() - twin.expires_at.replace(tzinfo=UTC) == timedelta(0)


async def test_a_twin_asking_less_is_handed_back_with_nothing_written(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    """A decision needing more than the twin asks (finance x2 for x1): the raw join
    hands it back (open_request supersedes the twin), and nothing of it stayed."""
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    approval_id = (await decide(h, runtime, scripted(needs(("finance", 1)))))["approval"]["id"]
    twin = await _twin(h, tenant, approval_id)
    with pytest.raises(NeedsCore):
        async with raw_transaction(h.db) as raw:
            assert raw is not None
            open_request_raw(raw, h.db.engine.dialect, h.settings,
                             call=_facts(twin, str(uuid.uuid4())),
                             requirement=parse_requirement(needs(("finance", 2))["approval"]),
                             opened_by={"subject": "s", "principal_id": None,
                                        "kind": "api_key"}, now=clock())
    assert await _twin(h, tenant, approval_id) == twin
