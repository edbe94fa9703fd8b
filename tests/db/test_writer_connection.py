"""The kept SQLite write connection of group-commit batches (issue 20): one connection
across batches, another process's write lock still waited for (up to the busy timeout),
a connection left in an unknown state never reused, and nothing of a failed COMMIT or of
another process killed (-9) between its BEGIN IMMEDIATE and its COMMIT kept."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import DBAPIError

from cosigner.core.errors import Unavailable
from cosigner.db.database import Database, UniqueViolation
from cosigner.db.raw_transaction import raw_transaction
from tests.conftest import migrated_database


@pytest.fixture
async def file_db(tmp_path: Path, sqlite_template: Path,
                  request: pytest.FixtureRequest) -> AsyncIterator[Database]:
    """A migrated SQLite file with table ``w``; busy timeout 400 ms, or the test's
    ``busy_ms`` marker's."""
    marker = request.node.get_closest_marker("busy_ms")
    db = Database(migrated_database(tmp_path, "sqlite", None, sqlite_template),
                  busy_timeout_ms=marker.args[0] if marker else 400)
    async with db.transaction() as conn:
        await conn.exec_driver_sql("CREATE TABLE w (x INTEGER PRIMARY KEY)")
    yield db
    await db.dispose()


def _other_process(db: Database) -> sqlite3.Connection:
    path = db.url.split("///", 1)[1]
    return sqlite3.connect(path, isolation_level=None, timeout=0)


def _rows(db: Database) -> list[int]:
    conn = _other_process(db)
    try:
        return [x for (x,) in conn.execute("SELECT x FROM w ORDER BY x")]
    finally:
        conn.close()


async def test_batches_share_one_connection_and_commit(file_db: Database) -> None:
    writer = file_db.sqlite_write_connection
    assert writer is not None
    for i in range(5):
        async with raw_transaction(file_db) as conn:
            assert conn is not None
            conn.execute("INSERT INTO w VALUES (?)", (i,))
    assert writer.opened == 1
    assert _rows(file_db) == [0, 1, 2, 3, 4]  # committed: another connection sees them
    await file_db.dispose()  # closed; the next batch opens a new one
    async with raw_transaction(file_db) as conn:
        assert conn is not None
        conn.execute("INSERT INTO w VALUES (5)")
    assert writer.opened == 2 and _rows(file_db)[-1] == 5


async def test_another_processs_write_lock_is_waited_for(file_db: Database) -> None:
    other = _other_process(file_db)
    try:
        async with raw_transaction(file_db) as conn:  # open the kept connection first
            assert conn is not None
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO w VALUES (100)")

        async def batch() -> None:
            async with raw_transaction(file_db) as conn:
                assert conn is not None
                conn.execute("INSERT INTO w VALUES (101)")

        waiting = asyncio.create_task(batch())
        await asyncio.sleep(0.1)
        assert not waiting.done()  # waits for the lock (busy timeout 400 ms) ...
        other.execute("COMMIT")
        await asyncio.wait_for(waiting, 5)  # ... and commits once it is free
        assert _rows(file_db) == [100, 101]

        other.execute("BEGIN IMMEDIATE")  # held past the busy timeout: 503, nothing kept
        with pytest.raises(Unavailable):
            await batch()
        other.execute("ROLLBACK")
    finally:
        other.close()
    writer = file_db.sqlite_write_connection
    assert writer is not None and writer.opened == 1
    async with raw_transaction(file_db) as conn:  # discarded after the failure: a new one
        assert conn is not None
        conn.execute("INSERT INTO w VALUES (102)")
    assert writer.opened == 2 and _rows(file_db) == [100, 101, 102]


async def test_a_failed_batch_leaves_nothing_and_no_open_transaction(
        file_db: Database) -> None:
    writer = file_db.sqlite_write_connection
    assert writer is not None
    with pytest.raises(UniqueViolation):
        async with raw_transaction(file_db) as conn:
            assert conn is not None
            conn.execute("INSERT INTO w VALUES (1)")
            try:
                conn.execute("INSERT INTO w VALUES (1)")
            except sqlite3.IntegrityError as exc:
                raise DBAPIError.instance("INSERT", None, exc, sqlite3.Error) from exc
    with pytest.raises(RuntimeError):
        async with raw_transaction(file_db) as conn:
            assert conn is not None
            conn.execute("INSERT INTO w VALUES (2)")
            raise RuntimeError("a refusal in the batch")
    assert _rows(file_db) == []  # both rolled back
    assert writer.opened == 1  # a rollback sufficed: the connection is kept
    with pytest.raises(Unavailable):
        async with raw_transaction(file_db) as conn:
            assert conn is not None
            try:
                conn.execute("INSERT INTO nowhere VALUES (1)")
            except sqlite3.Error as exc:
                raise DBAPIError.instance("INSERT", None, exc, sqlite3.Error) from exc
    async with raw_transaction(file_db) as conn:  # a database error: a new connection
        assert conn is not None
        conn.execute("INSERT INTO w VALUES (3)")
    assert writer.opened == 2 and _rows(file_db) == [3]


async def test_a_cancelled_commit_discards_the_connection(file_db: Database) -> None:
    writer = file_db.sqlite_write_connection
    assert writer is not None

    async def batch(x: int) -> None:
        async with raw_transaction(file_db) as conn:
            assert conn is not None
            conn.execute("INSERT INTO w VALUES (?)", (x,))

    task = asyncio.create_task(batch(1))
    for _ in range(100):  # cancel it somewhere between BEGIN and the COMMIT's answer
        await asyncio.sleep(0)
        if writer.busy:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await batch(2)  # the next batch works (on a new connection if that one was dropped)
    assert 2 in _rows(file_db)


def _path(db: Database) -> str:
    return db.url.split("///", 1)[1]


async def _batch(db: Database, *statements: str) -> None:
    async with raw_transaction(db) as conn:
        assert conn is not None
        for statement in statements:
            conn.execute(statement)


async def test_a_failed_commit_keeps_nothing_and_the_next_batch_works(
        file_db: Database) -> None:
    async with file_db.transaction() as conn:  # checked at COMMIT only
        await conn.exec_driver_sql(
            "CREATE TABLE c (p INTEGER REFERENCES w(x) DEFERRABLE INITIALLY DEFERRED)")
    with pytest.raises((UniqueViolation, Unavailable)):  # never an acknowledgement
        await _batch(file_db, "INSERT INTO w VALUES (1)", "INSERT INTO c VALUES (999)")
    assert _rows(file_db) == []
    writer = file_db.sqlite_write_connection
    assert writer is not None
    driver = await writer.connection()
    assert driver._connection is not None and not driver._connection.in_transaction
    await _batch(file_db, "INSERT INTO w VALUES (2)")
    assert _rows(file_db) == [2]
    # The kept connection still never waits between calls (WAL) after the failure.
    assert driver._connection.execute("PRAGMA busy_timeout").fetchone()[0] == 0


_HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=0)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO w VALUES (666)")
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.busy_ms(5000)
async def test_a_writer_killed_between_begin_and_commit_leaves_nothing(
        file_db: Database) -> None:
    await _batch(file_db, "INSERT INTO w VALUES (1)")  # the kept connection is open
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, _path(file_db)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        waiting = asyncio.create_task(_batch(file_db, "INSERT INTO w VALUES (2)"))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # waits for the other process's write lock
        os.kill(holder.pid, signal.SIGKILL)  # dies between its BEGIN and its COMMIT
        holder.wait(10)
        await asyncio.wait_for(waiting, 10)  # the lock died with it: our batch commits
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
    assert _rows(file_db) == [1, 2]  # nothing of the killed transaction
    await _batch(file_db, "INSERT INTO w VALUES (3)")
    assert _rows(file_db) == [1, 2, 3]


@pytest.mark.busy_ms(200)
async def test_a_writer_arriving_as_the_lock_passes_to_a_queued_one_still_times_out(
        file_db: Database) -> None:
    """The writer queue (``Database._sqlite_writer``) on one loop: A holds it, B queues,
    A releases — the lock is free but promised to B, who has not run yet. C arriving in
    that moment must still wait with the busy timeout (asyncio.Lock is fair: C's
    acquire() queues behind B whatever ``locked()`` says), so when B then holds the lock
    for good, C is answered 503 after the busy timeout instead of waiting forever."""
    go, a_done, b_in, forever = (asyncio.Event(), asyncio.Event(), asyncio.Event(),
                                 asyncio.Event())

    async def a() -> None:
        async with file_db._sqlite_writer():
            await a_done.wait()
            go.set()  # C's wake-up is scheduled before B's (the release below)
        # released here, in the same step as go.set()

    async def b() -> None:
        async with file_db._sqlite_writer():
            b_in.set()
            await forever.wait()

    async def c() -> None:
        await go.wait()
        async with file_db._sqlite_writer():
            pass

    holder = asyncio.create_task(a())
    await asyncio.sleep(0)
    queued = asyncio.create_task(b())
    await asyncio.sleep(0)
    late = asyncio.create_task(c())
    await asyncio.sleep(0)
    a_done.set()
    await holder
    try:
        with pytest.raises(Unavailable) as caught:
            await asyncio.wait_for(late, 2)
        assert caught.value.code == "storage_unavailable"
        assert b_in.is_set()
    finally:
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
    async with file_db._sqlite_writer():  # and the queue is free again
        pass


def _preempted_at(line: int, code: object, paused: threading.Event,
                  resume: threading.Event) -> Callable[..., Any]:
    """A ``sys.settrace`` function that stops its thread at the ``line``-th line run in
    ``code`` (counted over every resumption of the coroutine) until ``resume`` is set or
    0.5 s passed, setting ``paused`` meanwhile: a thread switch forced exactly there."""
    seen = 0

    def local(frame: Any, event: str, _arg: Any) -> Any:
        nonlocal seen
        if event == "line":
            seen += 1
            if seen == line:
                paused.set()
                resume.wait(0.5)
        return local

    def global_(frame: Any, event: str, _arg: Any) -> Any:
        return local if event == "call" and frame.f_code is code else None

    return global_


@pytest.mark.busy_ms(5000)
async def test_two_loops_never_share_the_kept_connection_wherever_one_is_preempted(
        file_db: Database) -> None:
    """Two event loops on two threads write through one Database (the kept connection's
    ``busy`` check, :class:`WriterConnection`). Thread A is preempted at each line of
    ``RawTransaction.__aenter__`` in turn while thread B runs a whole transaction: at
    no point may both take the kept connection (a second BEGIN on it fails, and its
    discard closes B's open transaction) — one of them takes a pooled connection, and
    both commit."""
    from cosigner.db.raw_transaction import RawTransaction

    code = RawTransaction.__aenter__.__code__
    line, key = 0, 1
    while True:
        line += 1
        paused, resume = threading.Event(), threading.Event()
        errors: list[BaseException] = []

        def a(key: int = key, line: int = line, paused: threading.Event = paused,
              resume: threading.Event = resume, errors: list[BaseException] = errors
              ) -> None:
            sys.settrace(_preempted_at(line, code, paused, resume))

            async def go() -> None:
                async with raw_transaction(file_db) as conn:
                    assert conn is not None
                    conn.execute("INSERT INTO w VALUES (?)", (key,))
            try:
                asyncio.run(go())
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
            finally:
                sys.settrace(None)
                paused.set()

        def b(key: int = key + 1, resume: threading.Event = resume,
              errors: list[BaseException] = errors) -> None:
            async def go() -> None:
                async with raw_transaction(file_db) as conn:
                    assert conn is not None
                    conn.execute("INSERT INTO w VALUES (?)", (key,))
                    resume.set()  # A goes on while B's transaction is open
                    await asyncio.sleep(0.05)
            try:
                asyncio.run(go())
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        first = threading.Thread(target=a)
        first.start()
        assert paused.wait(5)
        if not first.is_alive():  # A ran fewer lines than ``line``: every point tried
            first.join()
            assert not errors, errors
            break
        second = threading.Thread(target=b)
        second.start()
        second.join(10)
        first.join(10)
        assert not errors, (line, errors)
        assert {key, key + 1} <= set(_rows(file_db)), line
        key += 2
    assert line > 5  # really stepped through the check and the claim


async def test_a_transaction_sqlite_rolled_back_under_the_body_is_never_acknowledged(
        file_db: Database) -> None:
    """SQLite rolls a whole transaction back on some errors (``OR ROLLBACK`` conflicts,
    SQLITE_FULL, I/O errors); ``sqlite3``'s ``commit()`` is then a silent no-op. A body
    that caught such an error and went on must not get its exit taken as a COMMIT: the
    transaction answers 503, and the kept connection serves the next batch."""
    async with raw_transaction(file_db) as conn:
        assert conn is not None
        conn.execute("INSERT INTO w VALUES (1)")
    with pytest.raises(Unavailable) as caught:
        async with raw_transaction(file_db) as conn:
            assert conn is not None
            conn.execute("INSERT INTO w VALUES (5)")
            with pytest.raises(sqlite3.IntegrityError):
                conn.execute("INSERT OR ROLLBACK INTO w VALUES (1)")
    assert caught.value.code == "storage_unavailable"
    assert _rows(file_db) == [1]
    async with raw_transaction(file_db) as conn:
        assert conn is not None
        conn.execute("INSERT INTO w VALUES (6)")
    assert _rows(file_db) == [1, 6]
