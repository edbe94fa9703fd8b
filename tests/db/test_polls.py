"""The background polls (issue 20): an unchanged state costs one statement, and what
another process commits is seen by the next poll."""

from __future__ import annotations

from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.core.clock import FrozenClock
from cosigner.db import generations
from cosigner.db.database import Database
from cosigner.db.tables_approvals import approvals
from cosigner.db.tables_policy import policy_state
from cosigner.policy import follower as follower_module
from cosigner.policy import state as state_module
from tests.conftest import Harness, decision_request

T0 = datetime(2030, 1, 1, tzinfo=UTC)


#: Set in the test's own task: the harness's background loops (started before, with a
#: copy of the context that lacks it) make the same calls at times a loaded machine may
#: move into a test's counted window; only the test's own calls are counted.
_MINE: ContextVar[bool] = ContextVar("test_polls_mine", default=False)


def _count(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[Any]:
    """The calls of ``module.name`` made by the calling test (not by background loops)."""
    _MINE.set(True)
    calls: list[Any] = []
    real = getattr(module, name)

    async def counting(*args: Any, **kwargs: Any) -> Any:
        if _MINE.get():
            calls.append(args)
        return await real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


async def test_generations_follow_another_process(harness: Harness) -> None:
    before = await generations.read_all(harness.db)
    other = Database(harness.settings.database_url)
    try:
        async with other.transaction() as conn:
            await generations.bump(conn, generations.CREDENTIALS)
    finally:
        await other.dispose()
    after = await generations.read_all(harness.db)
    assert after[generations.CREDENTIALS] == before[generations.CREDENTIALS] + 1


async def test_policy_follower_reads_rows_only_when_a_generation_moved(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    follower = harness.tasks.policy_follower
    await follower.sync()  # whatever the background loop has not installed yet
    reads = _count(monkeypatch, follower_module, "read_state")
    statements = _count(monkeypatch, follower_module, "poll_rows")
    assert await follower.sync() is False
    assert await follower.sync() is False
    assert len(statements) == 2 and reads == []  # one statement a poll, rows untouched

    async with harness.db.read() as conn:
        bundle_id = (await conn.execute(select(policy_state.c.bundle_id).limit(1))).scalar()
    assert bundle_id is not None
    other = Database(harness.settings.database_url)  # another process changes the state
    try:
        async with other.transaction() as conn:
            await conn.execute(policy_state.update()
                               .where(policy_state.c.bundle_id == bundle_id)
                               .values(generation=policy_state.c.generation + 1))
    finally:
        await other.dispose()
    assert await follower.sync() is True
    assert len(reads) == 1
    assert harness.context.store.state is not None
    async with harness.db.read() as conn:
        stored = await state_module.read_state(conn)
    assert state_module.fingerprint(harness.context.store.state) == \
        state_module.fingerprint(stored)
    assert await follower.sync() is False


async def test_the_sweep_writes_only_when_a_request_is_due(
        harness_factory: Any, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from cosigner import tasks as tasks_module

    clock = FrozenClock(T0)
    h: Harness = await harness_factory(clock=clock)
    found: list[int] = []
    real = tasks_module.poll_rows

    async def counting(*args: Any, **kwargs: Any) -> Any:
        rows = await real(*args, **kwargs)
        if _MINE.get():
            found.append(len(rows))
        return rows

    monkeypatch.setattr(tasks_module, "poll_rows", counting)
    sweeps = _count(monkeypatch, tasks_module, "expire_due")
    runtime = await h.headers(tenant, "runtime")
    body = decision_request()
    body["args"]["amount_minor"] = 150000  # needs an approval
    resp = await h.client.post("/v1/decisions", headers=runtime, json=body)
    assert resp.json()["effect"] == "require_approval", resp.text
    await h.tasks._sweep_once()
    # One statement; the sweep itself runs only when it found a due request (another
    # test's on a shared database, possibly).
    assert len(found) == 1 and len(sweeps) == (1 if found[0] else 0)
    clock.advance(days=30)
    await h.tasks._sweep_once()
    assert found[-1] == 1 and len(sweeps) >= 1
    async with h.db.read() as conn:
        statuses = (await conn.execute(select(approvals.c.status)
                                       .where(approvals.c.tenant == tenant))).scalars().all()
    assert statuses and "pending" not in statuses
