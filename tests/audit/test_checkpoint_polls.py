"""The checkpointer's round (issue 20): nothing due costs one read of the heads; what
another process appends or signs is seen; a checkpoint another replica signed is not
signed again early."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from cosigner.audit import checkpoints
from cosigner.audit.chain import append
from cosigner.audit.checkpoints import Checkpointer
from cosigner.audit.events import Event
from cosigner.core.clock import FrozenClock
from cosigner.db.database import Database
from tests.conftest import Harness

T0 = datetime(2030, 1, 1, tzinfo=UTC)
ACTOR = {"subject": "test", "principal_id": None, "kind": "cli"}


async def _append(db: Database, tenant: str, count: int, now: datetime) -> None:
    async with db.transaction() as conn:
        await append(conn, tenant, [Event(type="test.event", actor=ACTOR)
                                    for _ in range(count)], now=now)


def _counted(monkeypatch: pytest.MonkeyPatch, only: Database) -> list[Any]:
    """The polls made through ``only`` (the harness's own background checkpointer polls
    through its database, at times a loaded machine may move into the counted window)."""
    calls: list[Any] = []
    real = checkpoints.poll_rows

    async def counting(db: Database, statement: Any, values: Any = None) -> Any:
        if db is only:
            calls.append((statement, dict(values or {})))
        return await real(db, statement, values)

    monkeypatch.setattr(checkpoints, "poll_rows", counting)
    return calls


async def test_a_round_with_nothing_due_reads_the_heads_once(
        harness_factory: Any, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FrozenClock(T0)
    h: Harness = await harness_factory(clock=clock)
    await _append(h.db, tenant, 2, clock())
    db = Database(h.settings.database_url)  # this checkpointer's own: its polls are counted
    try:
        mine = Checkpointer(db, h.context.keyring, clock, every_events=1000, every_s=3600)
        assert tenant not in [c.tenant for c in await mine.run_once()]
        calls = _counted(monkeypatch, db)
        for _ in range(3):
            assert tenant not in [c.tenant for c in await mine.run_once()]
        # One statement a round (the heads); nothing read about this tenant again.
        assert [s for s, _ in calls] == [checkpoints._HEADS] * 3
        assert not [v for _, v in calls if v.get("tenant") == tenant]
        clock.advance(seconds=3600)  # the time rule needs no read either
        assert [c.seq for c in await mine.run_once() if c.tenant == tenant] == [2]
    finally:
        await db.dispose()


async def test_another_processs_appends_and_checkpoints_are_followed(
        harness_factory: Any, tenant: str) -> None:
    clock = FrozenClock(T0)
    h: Harness = await harness_factory(clock=clock)
    other = Database(h.settings.database_url)  # another process on the same database
    try:
        here = Checkpointer(h.db, h.context.keyring, clock, every_events=4, every_s=60)
        there = Checkpointer(other, h.context.keyring, clock, every_events=4, every_s=60)
        assert tenant not in [c.tenant for c in await here.run_once()]
        await _append(other, tenant, 3, clock())
        assert tenant not in [c.tenant for c in await here.run_once()]
        await _append(other, tenant, 1, clock())
        assert [c.seq for c in await there.run_once() if c.tenant == tenant] == [4]
        # "here" still remembers no checkpoint: 6 events look due, but the database says
        # 4 is signed, so 2 past it are not (yet).
        await _append(other, tenant, 2, clock())
        assert tenant not in [c.tenant for c in await here.run_once()]
        clock.advance(seconds=60)  # the first event past 4 is now 60 s old
        assert [c.seq for c in await here.run_once() if c.tenant == tenant] == [6]
        await _append(other, tenant, 4, clock())  # 4 past 6: due by count
        assert [c.seq for c in await here.run_once() if c.tenant == tenant] == [10]
    finally:
        await other.dispose()
