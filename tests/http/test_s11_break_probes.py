"""Session 11 review probes: a decision log writer whose drain task is cancelled while
its batch's COMMIT runs (loop shutdown at the worst moment), over the real app and the
real database.

The waiter is answered 503 ``storage_unavailable`` (treat as deny) whether or not the
COMMIT went on to finish (SQLite finishes it on its worker thread; PostgreSQL cancels
it). A client that retries the same ``request_id`` on a replica (or after the restart
``/healthz`` asks for) gets one decision, never two: the first one replayed when it
was committed, else a new one — and its permit is redeemed once.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from typing import Any

import asyncpg
from sqlalchemy import func, select

from cosigner.core.settings import RateLimits
from cosigner.db.tables import decisions
from tests.conftest import decision_request
from tests.http.approval_helpers import refund_args
from tests.http.test_edge import pair

#: How long the SQLite COMMIT is held on its worker thread (before it is durable).
HELD_S = 0.5


async def _hold_commits(h: Any, tenant: str, db_kind: str, database_url: str
                        ) -> tuple[threading.Event, Any]:
    """Hold the next batch COMMIT of ``h``'s log writer; returns (in flight, undo)."""
    in_flight = threading.Event()
    if db_kind == "sqlite":
        writer = h.db.sqlite_write_connection
        assert writer is not None
        conn = (await writer.connection())._connection
        assert conn is not None

        def trace(sql: str) -> None:
            if sql == "COMMIT" and not in_flight.is_set():
                in_flight.set()
                time.sleep(HELD_S)

        conn.set_trace_callback(trace)

        async def undo_sqlite() -> None:
            with contextlib.suppress(sqlite3.ProgrammingError):  # discarded: closed
                conn.set_trace_callback(None)

        return in_flight, undo_sqlite
    dsn = database_url.replace("postgresql+asyncpg://", "postgresql://")
    name = "hold_" + tenant.replace("-", "_")
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql "
                            "AS $$ BEGIN PERFORM pg_sleep(5); RETURN NULL; END $$")
        await admin.execute(f"CREATE CONSTRAINT TRIGGER {name} AFTER INSERT ON decisions "
                            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
                            f"WHEN (NEW.tenant = '{tenant}') EXECUTE FUNCTION {name}()")
    finally:
        await admin.close()

    async def watch() -> None:
        watcher = await asyncpg.connect(dsn)
        try:
            for _ in range(2000):
                if await watcher.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND query = 'COMMIT' AND state = 'active'"):
                    in_flight.set()
                    return
                await asyncio.sleep(0.005)
        finally:
            await watcher.close()

    h.__dict__["_watch"] = asyncio.ensure_future(watch())

    async def undo_pg() -> None:
        admin = await asyncpg.connect(dsn)
        try:
            await admin.execute(f"DROP TRIGGER IF EXISTS {name} ON decisions")
            await admin.execute(f"DROP FUNCTION IF EXISTS {name}()")
        finally:
            await admin.close()

    return in_flight, undo_pg


async def test_a_writer_cancelled_mid_commit_answers_503_and_a_retry_acts_once(
        harness_factory: Any, tenant: str, db_kind: str, database_url: str) -> None:
    first = await harness_factory()
    key = await first.key(tenant, "runtime")
    headers = {"Authorization": f"Bearer {key}"}
    body = decision_request()
    # warm up: the kept writer connection (SQLite) and the batch link (PostgreSQL) exist
    assert (await first.client.post("/v1/decisions", headers=headers,
                                    json=decision_request())).status_code == 200
    in_flight, undo = await _hold_commits(first, tenant, db_kind, database_url)
    try:
        asking = asyncio.ensure_future(first.client.post("/v1/decisions", headers=headers,
                                                         json=body))
        for _ in range(2000):
            if in_flight.is_set():
                break
            await asyncio.sleep(0.005)
        assert in_flight.is_set(), "the COMMIT was never caught in flight"
        writer = first.context.log_writer
        assert writer._task is not None  # noqa: SLF001
        writer._task.cancel()  # noqa: SLF001 - the loop's shutdown, at the worst moment
        answered = await asyncio.wait_for(asyncio.shield(asking), 30)
        assert answered.status_code == 503, answered.text
        assert answered.json()["code"] == "storage_unavailable"
        assert (await first.client.get("/healthz")).status_code == 503
    finally:
        # past the held COMMIT first: setting the trace callback while the worker thread
        # sleeps inside it would wait for SQLite's mutex holding the GIL (a deadlock)
        await asyncio.sleep(HELD_S * 2 if db_kind == "sqlite" else 0)
        await undo()
    kept = 0
    for _ in range(100):  # the COMMIT settles (SQLite: its worker thread finishes it)
        await asyncio.sleep(0.1)
        async with first.db.read() as conn:
            kept = (await conn.execute(select(func.count()).select_from(decisions).where(
                decisions.c.tenant == tenant, decisions.c.request_id == body["request_id"])
            )).scalar_one()
        if kept or db_kind != "sqlite":
            break
    # SQLite's worker thread finishes the COMMIT; PostgreSQL's is cancelled with it
    assert kept == (1 if db_kind == "sqlite" else 0), kept
    # the retry, on a replica (or the restarted process)
    second = await harness_factory()
    retried = await second.client.post("/v1/decisions", headers=headers, json=body)
    assert retried.status_code == 200, retried.text
    again = await second.client.post("/v1/decisions", headers=headers, json=body)
    assert again.json() == retried.json()  # one decision: replayed from now on
    async with second.db.read() as conn:
        assert (await conn.execute(select(func.count()).select_from(decisions).where(
            decisions.c.tenant == tenant, decisions.c.request_id == body["request_id"])
        )).scalar_one() == 1
    permit = retried.json()["permit"]
    if permit is not None:  # the one act: its permit redeems once
        redeem = {"permit": permit["token"], "tool": body["tool"]["name"], "args": body["args"]}
        statuses = [(await second.client.post("/v1/permits/redeem", headers=headers,
                                              json=redeem)).status_code for _ in range(2)]
        assert statuses[0] == 200 and statuses[1] != 200, statuses


async def test_a_429_past_the_door_carries_the_request_id(harness_factory: Any,
                                                          tenant: str) -> None:
    """A 429 a route answers — the approvals quota, or a key the door's cache did not know
    yet — returns the request id like any answer, through the edge and through the stack;
    so does the rate-limit door's own 429 since session 15 (README § Logs)."""
    limits = {"*": RateLimits(credential_burst=0, credential_per_s=0, tenant_burst=1,
                              tenant_per_s=0, decisions_per_min=0, approvals_per_min=1)}
    for h in await pair(harness_factory, rate_limits=limits):
        h.pin_rate_windows(1_800_000_000.25)
        runtime = await h.headers(tenant, "runtime")
        opened = await h.client.post("/v1/decisions", headers=runtime, json=decision_request(
            run={"id": "run-quota"}, args=refund_args()))
        assert opened.status_code == 200 and opened.json()["approval"] is not None
        h.pin_rate_windows(1_800_000_001.25)  # a new second: the tenant burst has room
        again = await h.client.post(
            "/v1/decisions", headers={**runtime, "x-request-id": "r429-quota"},
            json=decision_request(run={"id": "run-quota-2"}, args=refund_args()))
        assert again.status_code == 429, again.text
        assert again.json()["limit"] == "approvals_per_min"
        assert again.headers["x-request-id"] == "r429-quota"
        # a second key of the tenant, unknown to the door, past the tenant's burst
        fresh = await h.headers(tenant, "runtime")
        await h.client.post("/v1/decisions", headers=runtime, json=decision_request())
        cold = await h.client.post("/v1/decisions",
                                   headers={**fresh, "x-request-id": "r429-cold"},
                                   json=decision_request())
        assert cold.status_code == 429, cold.text
        assert cold.headers["x-request-id"] == "r429-cold"
        door = await h.client.post("/v1/decisions",
                                   headers={**fresh, "x-request-id": "r429-door"},
                                   json=decision_request())
        assert door.status_code == 429 and door.headers["x-request-id"] == "r429-door"
