"""Redeem's reads under a burst (issue 20): concurrent redeems share their reads instead of
each holding a pooled connection, so a burst is answered without pool waits, and single
use still holds (exactly one 200, the rest ``already_redeemed``)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
from sqlalchemy import select

import cosigner.app
from cosigner.core.errors import Unavailable
from cosigner.db.database import Database
from cosigner.db.tables import audit_events
from cosigner.permits import redeem as redeem_module
from tests.conftest import Harness, decision_request
from tests.http.approval_helpers import decide, redeem, refund_args, review, state


@pytest.fixture
def small_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's database with a pool of 1 connection (+1 overflow) instead of 10 (+10)."""
    monkeypatch.setattr(cosigner.app, "Database", partial(Database, pool_size=1))


def _watch(db: Database) -> dict[str, int]:
    """From now on: ``reads``, how many read transactions (:meth:`Database.read`, a pooled
    connection each) redeem opened. Other reads (an API key looked up again) are not
    counted. On a SQLite file redeem reads on the raw driver (none)."""
    seen = {"reads": 0}
    read = db.read

    def counted(**kwargs: Any) -> Any:
        if sys._getframe(1).f_code.co_filename == redeem_module.__file__:  # noqa: SLF001
            seen["reads"] += 1
        return read(**kwargs)

    db.read = counted  # type: ignore[method-assign]
    return seen


async def _burst(h: Harness, tenant: str, runtime: dict[str, str], token: str,
                 args: dict[str, Any], n: int) -> None:
    responses = await asyncio.gather(*(
        redeem(h, runtime, token, "issue_refund", args) for _ in range(n)))
    statuses = sorted(r.status_code for r in responses)
    # No retry of a 503 here: not one of the burst may wait past the pool's timeout.
    assert statuses.count(200) == 1, [r.text for r in responses if r.status_code != 409]
    assert statuses.count(409) == n - 1, statuses
    assert {r.json()["code"] for r in responses if r.status_code == 409} == {
        "already_redeemed"}
    async with h.db.read() as conn:
        types = (await conn.execute(select(audit_events.c.type).where(
            audit_events.c.tenant == tenant,
            audit_events.c.type.in_(["permit.redeemed", "permit.refused"])))).scalars().all()
    assert types.count("permit.redeemed") == 1 and types.count("permit.refused") == n - 1


async def test_200_concurrent_redeems_on_a_pool_of_two(small_pool: None,
                                                       harness_factory: Any,
                                                       tenant: str) -> None:
    h: Harness = await harness_factory()
    runtime = await h.headers(tenant, "runtime")
    decision = await decide(h, runtime, decision_request(args=refund_args(5000)))
    seen = _watch(h.db)
    await _burst(h, tenant, runtime, decision["permit"]["token"], refund_args(5000), 200)
    # The burst's reads of one permit share a read (before: one per request, 200, each
    # waiting for one of the 2 connections; on a loaded machine past the pool's timeout).
    assert seen["reads"] <= 50, seen


async def test_burst_needs_no_connection_per_request(harness: Harness, tenant: str) -> None:
    """With the default pool (20 connections): a read shared by waiters, not one per request."""
    runtime = await harness.headers(tenant, "runtime")
    decision = await decide(harness, runtime, decision_request(args=refund_args(5000)))
    seen = _watch(harness.db)
    await _burst(harness, tenant, runtime, decision["permit"]["token"], refund_args(5000),
                 100)
    # Before: 100 reads on PostgreSQL, up to 20 connections at once (the whole pool).
    assert seen["reads"] <= 25, seen


async def test_burst_of_an_approved_permit(small_pool: None, harness_factory: Any,
                                           tenant: str) -> None:
    """The same with the approval's counted reviews read (the policy re-check)."""
    h: Harness = await harness_factory()
    runtime = await h.headers(tenant, "runtime")
    body = decision_request(run={"id": "run-burst"}, args=refund_args(150_000))
    approval_id = (await decide(h, runtime, body))["approval"]["id"]
    finance = await h.headers(tenant, "finance", subject="alice")
    assert (await review(h, finance, approval_id)).json()["status"] == "approved"
    token = (await state(h, runtime, approval_id))["permit"]["token"]
    seen = _watch(h.db)
    await _burst(h, tenant, runtime, token, refund_args(150_000), 50)
    assert seen["reads"] <= 13, seen


# --- the coalescing itself (redeem._Reads), on a stand-in database -----------------------


class _FakeDb:
    def __init__(self) -> None:
        self.opened = 0
        self.fail: Exception | None = None

    @asynccontextmanager
    async def read(self) -> AsyncIterator[str]:
        if self.fail is not None:
            raise self.fail
        self.opened += 1
        yield f"conn-{self.opened}"


class _Stub:
    def __init__(self, jti: str) -> None:
        self.jti = jti
        self.decision_id = f"d-{jti}"
        self.approval_id = None


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, str]], asyncio.Event]:
    """``_read_on`` replaced: records ``(connection, jti)`` and waits for the event."""
    seen: list[tuple[str, str]] = []
    go = asyncio.Event()

    async def read_on(conn: str, tenant: str, jti: str, decision_id: str,
                      approval_id: str | None) -> Any:
        seen.append((conn, jti))
        await go.wait()
        return [jti, conn]

    monkeypatch.setattr(redeem_module, "_read_on", read_on)
    return seen, go


async def test_reads_of_one_permit_share_one_read(calls: Any) -> None:
    seen, go = calls
    db = _FakeDb()
    reads = redeem_module._Reads(db)  # type: ignore[arg-type]  # noqa: SLF001
    first = [asyncio.ensure_future(reads.read("t", _Stub(jti)))  # type: ignore[arg-type]
             for jti in ["a", "a", "a", "b"]]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    # One read per permit, distinct permits side by side on their own connections.
    assert seen == [("conn-1", "a"), ("conn-2", "b")]
    # Arrived once the read of "a" held its connection: not joined to it (its snapshot
    # would predate the request), read on its own.
    late = asyncio.ensure_future(reads.read("t", _Stub("a")))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    go.set()
    results = await asyncio.gather(*first, late)
    assert seen == [("conn-1", "a"), ("conn-2", "b"), ("conn-3", "a")]
    assert results == [["a", "conn-1"]] * 3 + [["b", "conn-2"], ["a", "conn-3"]]
    assert results[1] is not results[0]  # a joiner gets its own copy
    await asyncio.sleep(0)
    assert not reads.tasks and not reads.queued


async def test_a_failed_read_fails_its_waiters_and_the_next_read_reads(calls: Any) -> None:
    seen, go = calls
    go.set()
    db = _FakeDb()
    db.fail = Unavailable("the database is unavailable", code="storage_unavailable")
    reads = redeem_module._Reads(db)  # type: ignore[arg-type]  # noqa: SLF001
    outcomes = await asyncio.gather(*(reads.read("t", _Stub(j))  # type: ignore[arg-type]
                                      for j in ["a", "a", "b"]), return_exceptions=True)
    assert all(isinstance(o, Unavailable) and o.code == "storage_unavailable"
               for o in outcomes), outcomes
    db.fail = None
    assert await reads.read("t", _Stub("a")) == ["a", "conn-1"]  # type: ignore[arg-type]
    assert seen == [("conn-1", "a")]


async def test_a_cancelled_waiter_cancels_neither_the_read_nor_the_others(
        calls: Any) -> None:
    seen, go = calls
    reads = redeem_module._Reads(_FakeDb())  # type: ignore[arg-type]  # noqa: SLF001
    gone = asyncio.ensure_future(reads.read("t", _Stub("a")))  # type: ignore[arg-type]
    kept = asyncio.ensure_future(reads.read("t", _Stub("a")))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    gone.cancel()
    go.set()
    assert await kept == ["a", "conn-1"]
    assert gone.cancelled() and seen == [("conn-1", "a")]
