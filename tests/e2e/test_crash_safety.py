"""Crash safety (issue 9, DESIGN invariants 2, 4 and 9; case K22): a live server under mixed
load (allow, deny, require_approval, redeem) is killed with SIGKILL at random moments and
restarted, or loses its database mid-run. Whatever the client was told stays true: every
200 decision is in the log, nothing is logged twice, the chain verifies, no permit is
redeemed twice, and an unavailable database answers 503 (deny), never an unlogged allow."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.conftest import PG_BASE_URL, LiveServer, _pg_admin
from tests.e2e.helpers import (
    AMOUNT,
    PYTHON_BUNDLES,
    Log,
    client,
    make_keys,
    read_log,
    refund,
)

pytestmark = pytest.mark.slow

KINDS = ["allow", "allow", "deny", "require_approval"]


@dataclass
class Record:
    """What the client saw."""

    decisions: list[tuple[dict[str, Any], int, dict[str, Any]]] = field(default_factory=list)
    redeems: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    unanswered: list[dict[str, Any]] = field(default_factory=list)
    transport_errors: int = 0


async def _redeem(c: httpx.AsyncClient, auth: dict[str, str], rec: Record,
                  permit: dict[str, Any], args: dict[str, Any]) -> None:
    try:
        r = await c.post("/v1/permits/redeem", headers=auth,
                         json={"permit": permit["token"], "tool": "issue_refund", "args": args})
    except httpx.TransportError:
        rec.transport_errors += 1
        return
    rec.redeems.append((permit["jti"], r.status_code, r.json()))


async def drive(c: httpx.AsyncClient, auth: dict[str, str], rec: Record, stop: asyncio.Event,
                rng: random.Random) -> None:
    """One client: decide mixed calls; redeem each allow (sometimes twice at once)."""
    run = f"run-{rng.getrandbits(32):08x}"
    while not stop.is_set():
        body = refund(AMOUNT[rng.choice(KINDS)], run=run)
        try:
            r = await c.post("/v1/decisions", headers=auth, json=body)
        except httpx.TransportError:  # killed, restarting, or the answer was lost
            rec.transport_errors += 1
            rec.unanswered.append(body)
            await asyncio.sleep(0.05)
            continue
        data = r.json()
        rec.decisions.append((body, r.status_code, data))
        if r.status_code == 200 and data["effect"] == "allow":
            await asyncio.gather(*(_redeem(c, auth, rec, data["permit"], body["args"])
                                   for _ in range(rng.choice([1, 1, 2]))))


async def retry_unanswered(c: httpx.AsyncClient, auth: dict[str, str], rec: Record) -> None:
    """A client retries a call whose answer it lost with the same request_id: it gets the
    first decision if that was recorded, a new one otherwise — never two."""
    pending, rec.unanswered = rec.unanswered, []
    for body in pending:
        r = await c.post("/v1/decisions", headers=auth, json=body)
        rec.decisions.append((body, r.status_code, r.json()))


def check(rec: Record, log: Log) -> None:
    log.assert_consistent()
    made = {e.decision_id: e for e in log.of_type("decision.made")}
    assert {s for _, s, _ in rec.decisions} <= {200, 503}, Counter(
        s for _, s, _ in rec.decisions)
    ok = [(body, data) for body, s, data in rec.decisions if s == 200]
    assert ok, "no decision was answered"
    for _, data in ok:
        event = made.get(data["decision_id"])
        assert event is not None, f"answered 200 but not in the log: {data}"
        assert event.effect == data["effect"]
        if data["effect"] == "allow":
            assert data["permit"]["jti"] in {r.jti for r in log.permit_rows}
    # One request_id, one decision, however often it was sent.
    by_request: dict[str, set[str]] = {}
    for body, data in ok:
        by_request.setdefault(body["request_id"], set()).add(data["decision_id"])
    assert all(len(ids) == 1 for ids in by_request.values())
    assert {s for _, s, _ in rec.redeems} <= {200, 409, 503}, Counter(
        s for _, s, _ in rec.redeems)
    won = Counter(jti for jti, s, _ in rec.redeems if s == 200)
    assert all(n == 1 for n in won.values()), "a permit was redeemed twice"
    redeemed = {e.permit_jti for e in log.of_type("permit.redeemed")}
    assert set(won) <= redeemed, "a 200 redeem is not in the log"
    assert {d["code"] for _, s, d in rec.redeems if s == 409} <= {"already_redeemed"}


async def test_k22_sigkill_under_mixed_load_loses_and_duplicates_nothing(
        live_server_factory: Callable[..., LiveServer], database_url: str,
        tenant: str) -> None:
    rng = random.Random()
    server = live_server_factory(COSIGNER_BUNDLE_DIRS=PYTHON_BUNDLES)
    auth = {"Authorization": (await make_keys(database_url, tenant,
                                              {"rt": (["runtime"], "rt")}))["rt"]}
    rec = Record()
    async with client(server.url, connections=32, timeout_s=30) as c:
        stop = asyncio.Event()
        drivers = [asyncio.create_task(drive(c, auth, rec, stop, random.Random(rng.random())))
                   for _ in range(12)]
        for _ in range(3):
            await asyncio.sleep(rng.uniform(0.3, 1.2))
            assert server.proc is not None
            server.proc.kill()  # SIGKILL: no shutdown, no flush, in the middle of batches
            server.proc.wait()
            server.proc = None
            await asyncio.to_thread(server.start, "--no-migrate")
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*drivers)
        await retry_unanswered(c, auth, rec)
    assert rec.transport_errors > 0, "the kills interrupted nothing"
    check(rec, await read_log(database_url, tenant))


class SqliteOutage:
    """Another process takes SQLite's write lock (BEGIN EXCLUSIVE) and holds it well past
    the server's busy timeout (``COSIGNER_DB_BUSY_TIMEOUT_MS``): writes meanwhile fail
    ("database is locked") after waiting; reads still work (WAL)."""

    def __init__(self, path: str, hold_s: float) -> None:
        self.path, self.hold_s = path, hold_s

    def run(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            threading.Event().wait(self.hold_s)
            conn.execute("ROLLBACK")
        finally:
            conn.close()


def _pg_outage(database: str, down_s: float) -> None:
    """No connection to ``database`` for ``down_s``: new ones refused, open ones killed."""
    _pg_admin(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS false')
    try:
        _pg_admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  f"WHERE datname = '{database}' AND pid <> pg_backend_pid()")
        threading.Event().wait(down_s)
    finally:
        _pg_admin(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS true')


async def test_k22_database_unavailable_answers_503_never_an_unlogged_allow(
        live_server_factory: Callable[..., LiveServer], database_url: str, db_kind: str,
        tenant: str) -> None:
    assert PG_BASE_URL  # the admin connection of _pg_outage
    server = live_server_factory(COSIGNER_BUNDLE_DIRS=PYTHON_BUNDLES,
                                 COSIGNER_DB_BUSY_TIMEOUT_MS="500")
    auth = {"Authorization": (await make_keys(database_url, tenant,
                                              {"rt": (["runtime"], "rt")}))["rt"]}
    rec = Record()
    async with client(server.url, connections=32, timeout_s=60) as c:
        stop = asyncio.Event()
        drivers = [asyncio.create_task(drive(c, auth, rec, stop, random.Random(i)))
                   for i in range(8)]
        await asyncio.sleep(1.0)
        before = len(rec.decisions)
        if db_kind == "sqlite":
            outage = SqliteOutage(database_url.split("///", 1)[1], hold_s=4.0)
            await asyncio.to_thread(outage.run)
        else:
            await asyncio.to_thread(_pg_outage, database_url.rsplit("/", 1)[1], 3.0)
        await asyncio.sleep(1.5)  # the database is back: answers are 200 again
        stop.set()
        await asyncio.gather(*drivers)
        after = [s for _, s, _ in rec.decisions[before:]]
        await retry_unanswered(c, auth, rec)
    assert 503 in after, "the outage was never noticed"
    assert after[-1] == 200 or 200 in after[-5:], "the server did not recover"
    check(rec, await read_log(database_url, tenant))
