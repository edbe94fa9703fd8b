"""Group-commit scheduling on a real database (SQLite file or PostgreSQL): clients in
lockstep, each sending its next write the moment the previous one is answered, so that
every batch holds every writer in flight and the drain task starts each batch with no
gather wait (cosigner.db.group_commit, "Gathering only while it brings company").

* No acknowledgement before the COMMIT (DESIGN invariant 2): the moment a waiter is
  answered, its row is visible from another connection. The COMMIT is slowed (SQLite: a
  trace callback on the kept write connection sleeps before the ``COMMIT`` statement, on
  the worker thread; PostgreSQL: a deferred constraint trigger sleeps at commit), so an
  answer sent before the COMMIT ended would find its row missing.
* No lost waiter: every submit is answered, with its own result, within a bound.
* A batch that fails answers 503 ``storage_unavailable`` to each of its waiters, nothing
  of it is kept, and the writer goes on with the next batch.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.core.errors import Unavailable
from cosigner.db.batch import Item, PgHooks, RawHooks, Write, savepoint_runner
from cosigner.db.database import Database
from cosigner.db.group_commit import GroupCommitter
from cosigner.db.tables import permits

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
CLIENTS = 8
ROUNDS = 6
#: How long each COMMIT is held (SQLite: once per batch; PostgreSQL: once per row).
SLOW_COMMIT_S = 0.02
SLOW_ROW_S = 0.003


def _row(tenant: str, jti: str) -> dict[str, Any]:
    return {"jti": jti, "tenant": tenant, "decision_id": f"d-{jti}", "approval_id": None,
            "run_id": "r", "tool": "t", "args_hash": "h", "status": "issued",
            "issued_at": NOW, "expires_at": NOW, "redeemed_at": None, "revoked_at": None}


def _write(tenant: str, jti: str) -> Write:
    return Write(tenant, [], jti, [(permits, _row(tenant, jti))])


class _Visible:
    """Whether a permit row is committed, read on a connection of its own (never the
    writer's): synchronous ``sqlite3`` on a file, an asyncpg pool (one connection per
    client) on PostgreSQL."""

    def __init__(self, db: Database) -> None:
        self.db = db
        # The jti as stored (a compact id: bytes on SQLite), through the column's type.
        dialect = db.engine.dialect
        self.key = permits.c.jti.type.dialect_impl(dialect).bind_processor(dialect) or str
        self.sqlite: sqlite3.Connection | None = None
        self.pg: asyncpg.Pool | None = None

    async def open(self) -> None:
        if self.db.is_sqlite:
            self.sqlite = sqlite3.connect(self.db.url.split("///", 1)[1],
                                          isolation_level=None)
        else:
            self.pg = await asyncpg.create_pool(_dsn(self.db), min_size=CLIENTS,
                                                max_size=CLIENTS)

    async def __call__(self, jti: str) -> bool:
        sql = "SELECT count(*) FROM permits WHERE jti = "
        if self.sqlite is not None:  # no await between the answer and this read
            return bool(self.sqlite.execute(sql + "?", (self.key(jti),)).fetchone()[0])
        assert self.pg is not None
        return bool(await self.pg.fetchval(sql + "$1", self.key(jti)))

    async def close(self) -> None:
        if self.sqlite is not None:
            self.sqlite.close()
        if self.pg is not None:
            await self.pg.close()


def _dsn(db: Database) -> str:
    return db.engine.url.render_as_string(hide_password=False).replace(
        "postgresql+asyncpg://", "postgresql://")


async def _slow_commits(db: Database, tenant: str) -> Callable[[], Awaitable[None]]:
    """Hold every COMMIT of ``tenant``'s batches for a while; returns the undo."""
    if db.is_sqlite:
        writer = db.sqlite_write_connection
        assert writer is not None
        conn = (await writer.connection())._connection
        assert conn is not None

        def trace(sql: str) -> None:
            if sql == "COMMIT":  # on the worker thread, before the commit is durable
                time.sleep(SLOW_COMMIT_S)

        conn.set_trace_callback(trace)

        async def undo_sqlite() -> None:
            conn.set_trace_callback(None)

        return undo_sqlite
    name = "slow_" + tenant.replace("-", "_")
    admin = await asyncpg.connect(_dsn(db))
    try:
        await admin.execute(
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN PERFORM pg_sleep({SLOW_ROW_S}); RETURN NULL; END $$")
        await admin.execute(
            f"CREATE CONSTRAINT TRIGGER {name} AFTER INSERT ON permits "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
            f"WHEN (NEW.tenant = '{tenant}') EXECUTE FUNCTION {name}()")
    finally:
        await admin.close()

    async def undo_pg() -> None:
        admin = await asyncpg.connect(_dsn(db))
        try:
            await admin.execute(f"DROP TRIGGER IF EXISTS {name} ON permits")
            await admin.execute(f"DROP FUNCTION IF EXISTS {name}()")
        finally:
            await admin.close()

    return undo_pg


def _committer(db: Database, fail_when: str | None = None, *, fail_in: str = "finish"
               ) -> GroupCommitter[Item]:
    """The decision log's batch runner (raw SQLite / asyncpg bulk path) with guard and
    finish hooks; the hook ``fail_in`` (``"guard"`` or ``"finish"``) fails a batch
    holding the write ``fail_when`` with an unexpected exception."""

    def check(hook: str, writes: list[Write]) -> None:
        if hook == fail_in and fail_when is not None and any(
                w.result == fail_when for w in writes):
            raise OSError("the disk went away")  # not a database error: fails the batch

    async def guard(conn: AsyncConnection, writes: list[Write]) -> dict[int, Any]:
        check("guard", writes)
        return {}

    async def finish(conn: AsyncConnection, writes: list[Write]) -> None:
        check("finish", writes)

    def guard_raw(conn: sqlite3.Connection, dialect: Dialect, writes: list[Write]
                  ) -> dict[int, Any]:
        check("guard", writes)
        return {}

    def finish_raw(conn: sqlite3.Connection, dialect: Dialect, writes: list[Write]) -> None:
        check("finish", writes)

    async def guard_pg(conn: Any, dialect: Dialect, writes: list[Write]) -> dict[int, Any]:
        check("guard", writes)
        return {}

    async def finish_pg(conn: Any, dialect: Dialect, writes: list[Write]) -> None:
        check("finish", writes)

    run = savepoint_runner(db, finish=finish, guard=guard,
                           raw=RawHooks(guard_raw, finish_raw),
                           pg=PgHooks(guard_pg, finish_pg))
    # A long gather timer: lockstep batches must not wait for it (beyond the first).
    return GroupCommitter(run, max_batch=64, max_wait_s=0.05, name="scheduling_test")


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    yield database
    await database.dispose()


async def _lockstep(committer: GroupCommitter[Item], visible: _Visible, tenant: str
                    ) -> dict[str, Any]:
    """``CLIENTS`` clients × ``ROUNDS`` writes; each answer checked against the
    database at once. Returns jti → the answer (the write, or the exception)."""
    answers: dict[str, Any] = {}
    early: list[str] = []

    async def client(number: int) -> None:
        for round_no in range(ROUNDS):
            jti = f"{tenant}-{number}-{round_no}"
            try:
                answer: Any = await committer.submit(_write(tenant, jti), key=tenant)
            except Unavailable as exc:
                answers[jti] = exc
                continue
            answers[jti] = answer
            if not await visible(jti):
                early.append(jti)

    await asyncio.wait_for(asyncio.gather(*(client(n) for n in range(CLIENTS))), 60)
    assert early == []  # each answer came after its COMMIT, never before
    assert len(answers) == CLIENTS * ROUNDS  # every waiter answered: none lost
    return answers


@asynccontextmanager
async def _slowed_committer(db: Database, tenant: str, **options: Any
                            ) -> AsyncIterator[tuple[GroupCommitter[Item], _Visible]]:
    """A started committer (``_committer(db, **options)``) whose COMMITs of ``tenant``'s
    rows are slowed, and a second connection that sees what was committed; all undone on
    exit."""
    visible = _Visible(db)
    await visible.open()
    undo = await _slow_commits(db, tenant)
    committer = _committer(db, **options)
    committer.start()
    try:
        yield committer, visible
    finally:
        await committer.stop()
        await undo()
        await visible.close()


async def test_lockstep_clients_are_answered_after_their_commit(db: Database,
                                                                tenant: str) -> None:
    async with _slowed_committer(db, tenant) as (committer, visible):
        answers = await _lockstep(committer, visible, tenant)
    assert all(isinstance(a, Write) and a.result == jti for jti, a in answers.items())
    # Lockstep: every batch held every client (one batch per round).
    assert committer.stats.items == CLIENTS * ROUNDS
    assert committer.stats.largest_batch == CLIENTS


@pytest.mark.parametrize("fail_in", ["guard", "finish"])
async def test_a_failed_batch_answers_each_of_its_waiters_503(db: Database, tenant: str,
                                                              fail_in: str) -> None:
    async with _slowed_committer(db, tenant, fail_when=f"{tenant}-3-2",
                                 fail_in=fail_in) as (committer, visible):
        answers = await _lockstep(committer, visible, tenant)
        failed = {jti for jti, a in answers.items() if isinstance(a, Unavailable)}
        assert f"{tenant}-3-2" in failed
        assert all(answers[jti].code == "storage_unavailable" for jti in failed)
        assert committer.stats.failed_batches == 1
        # The failed batch's rows were rolled back; every other batch's rows are kept.
        for jti in answers:
            assert await visible(jti) == (jti not in failed), jti
        assert any(isinstance(a, Write) and a.result.endswith(f"-{ROUNDS - 1}")
                   for a in answers.values())  # the writer went on after the failure


async def test_a_waiter_cancelled_in_a_batch_leaves_the_others_answered(
        db: Database, tenant: str) -> None:
    """Clients that disconnect (their request task cancelled) while their write is in a
    committing batch: the batch still commits, every other waiter gets its own answer
    after the COMMIT, the writer goes on, and nothing is answered to the cancelled."""
    async with _slowed_committer(db, tenant) as (committer, visible):
        jtis = [f"{tenant}-c-{i}" for i in range(CLIENTS)]
        first = asyncio.ensure_future(committer.submit(_write(tenant, "lead"), key=tenant))
        await asyncio.sleep(0.005)  # the lead's batch is committing: the rest gather
        waiters = [asyncio.ensure_future(committer.submit(_write(tenant, j), key=tenant))
                   for j in jtis]
        await asyncio.sleep(0)
        await first
        await asyncio.sleep(0.005)  # the second batch is running
        for w in waiters[::3]:
            w.cancel()
        outcomes = await asyncio.wait_for(
            asyncio.gather(*waiters, return_exceptions=True), 30)
        for jti, waiter, outcome in zip(jtis, waiters, outcomes, strict=True):
            if waiter.cancelled():
                continue
            assert isinstance(outcome, Write) and outcome.result == jti, outcome
            assert await visible(jti), jti  # answered after its COMMIT
        assert any(w.cancelled() for w in waiters)
        later = await asyncio.wait_for(
            committer.submit(_write(tenant, f"{tenant}-after"), key=tenant), 30)
        assert later.result == f"{tenant}-after"


async def test_a_connection_lost_during_the_commit_answers_503_and_reconnects(
        db: Database, tenant: str) -> None:
    """PostgreSQL: the batch connection's backend is terminated while its COMMIT runs
    (held by the deferred trigger, before the commit record): every waiter of the batch
    gets 503 ``storage_unavailable``, none of its rows is kept, and the next batch runs
    on a new connection."""
    if db.is_sqlite:
        pytest.skip("a lost server connection is PostgreSQL's (SQLite: a failed COMMIT, "
                    "test_writer_connection.py)")
    async with _slowed_committer(db, tenant) as (committer, visible):
        admin = await asyncpg.connect(_dsn(db))
        try:
            jtis = [f"{tenant}-lost-{i}" for i in range(CLIENTS)]
            waiters = [asyncio.ensure_future(committer.submit(_write(tenant, j), key=tenant))
                       for j in jtis]
            killed = 0
            for _ in range(400):
                killed = await admin.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND query = 'COMMIT' "
                    "AND state = 'active' AND pid <> pg_backend_pid()")  # this test's own
                if killed:
                    break
                await asyncio.sleep(0.002)
            assert killed, "no COMMIT caught in flight"
            outcomes = await asyncio.wait_for(
                asyncio.gather(*waiters, return_exceptions=True), 30)
            assert all(isinstance(o, Unavailable) and o.code == "storage_unavailable"
                       for o in outcomes), outcomes
            for jti in jtis:
                assert not await visible(jti), jti
            later = await asyncio.wait_for(
                committer.submit(_write(tenant, f"{tenant}-after"), key=tenant), 30)
            assert later.result == f"{tenant}-after"
            assert await visible(f"{tenant}-after")
        finally:
            await admin.close()


async def test_a_bulk_attempt_rolled_back_under_its_body_is_never_acknowledged(
        db: Database, tenant: str) -> None:
    """The raw bulk attempt's ``finish`` catches a database error that ended the whole
    transaction (SQLite: an ``INSERT OR ROLLBACK`` conflict; PostgreSQL: a failed
    statement aborts it, and its COMMIT is answered ``ROLLBACK``): nothing of that
    attempt is acknowledged. SQLite answers its waiters 503 (an outage: its cause is an
    ``OperationalError``); PostgreSQL redoes the batch item by item on the SQLAlchemy
    path (its cause, ``InFailedSQLTransaction``, is not an outage), and each waiter is
    answered after its own COMMIT (``_lockstep`` reads every acknowledged row at once)."""
    culprit = f"{tenant}-3-2"

    def finish_raw(conn: sqlite3.Connection, dialect: Dialect, writes: list[Write]) -> None:
        if any(w.result == culprit for w in writes):
            row = conn.execute("SELECT jti, tenant, decision_id, run_id, tool, args_hash, "
                               "status, issued_at, expires_at FROM permits LIMIT 1").fetchone()
            try:  # a conflict whose resolution is ROLLBACK, caught
                conn.execute("INSERT OR ROLLBACK INTO permits (jti, tenant, decision_id, "
                             "run_id, tool, args_hash, status, issued_at, expires_at) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
            except sqlite3.IntegrityError:
                pass

    async def finish_pg(conn: Any, dialect: Dialect, writes: list[Write]) -> None:
        if any(w.result == culprit for w in writes):
            try:
                await conn.execute("SELECT 1 / 0")
            except asyncpg.DivisionByZeroError:
                pass

    async def finish(conn: AsyncConnection, writes: list[Write]) -> None:
        return None

    async def guard_pg(conn: Any, dialect: Dialect, writes: list[Write]) -> dict[int, Any]:
        return {}

    run = savepoint_runner(db, finish=finish,
                           raw=RawHooks(lambda conn, dialect, writes: {}, finish_raw),
                           pg=PgHooks(guard_pg, finish_pg))
    committer: GroupCommitter[Item] = GroupCommitter(run, max_batch=64, max_wait_s=0.05)
    visible = _Visible(db)
    await visible.open()
    committer.start()
    try:
        answers = await _lockstep(committer, visible, tenant)  # none acknowledged early
        failed = {jti for jti, a in answers.items() if isinstance(a, Unavailable)}
        if db.is_sqlite:
            assert culprit in failed
        else:
            assert failed == set()
        for jti, answer in answers.items():
            assert await visible(jti) == (jti not in failed), jti
            assert jti in failed or (isinstance(answer, Write) and answer.result == jti)
    finally:
        await committer.stop()
        await visible.close()
