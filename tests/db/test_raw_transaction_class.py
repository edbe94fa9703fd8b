"""The batch transaction and the raw read connection as small classes (session 10,
issue 20) behave as the generator-based context managers they replaced: both forms
(the former kept below as the reference) are driven through the same faults — a body
that raises (a plain error, a driver error, SQLAlchemy's wrapped driver errors, a
cancellation), a failed ``BEGIN``, a failed ``COMMIT``, an unopenable connection, the
pooled fallback, a failed ``ROLLBACK``, re-entrance — and must raise the same error
(type, code, cause), log the same lines, keep the same rows and leave the connection,
its claim (``busy``) and the writer queue in the same state."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.util import greenlet_spawn

from cosigner.core.errors import Unavailable
from cosigner.db import raw_sql
from cosigner.db.database import Database, UniqueViolation, _short
from cosigner.db.raw_sql import read_connection
from cosigner.db.raw_transaction import _rollback, raw_transaction
from cosigner.db.sqlite_inline import InlineConnection, WriterConnection
from tests.conftest import migrated_database
from tests.db.test_writer_connection import _other_process, _rows

log = logging.getLogger("cosigner.db.database")


# --- the reference: the generator-based forms before session 10 -----------------------

@asynccontextmanager
async def _reference_transaction(db: Database) -> AsyncIterator[sqlite3.Connection | None]:
    async with db._sqlite_writer():
        writer = db.sqlite_write_connection
        if writer is None or not writer.claim():
            async with _reference_pooled(db) as conn:
                yield conn
            return
        try:
            try:
                driver = await writer.connection()
            except sqlite3.Error as exc:
                writer.discard()
                log.error("database transaction failed: %s: %s", type(exc).__name__, exc)
                raise Unavailable("the database is unavailable; nothing was recorded",
                                  code="storage_unavailable") from exc
            async with _reference_begin(driver, writer) as conn:
                yield conn
        finally:
            writer.release()


@asynccontextmanager
async def _reference_begin(driver: InlineConnection, writer: WriterConnection | None
                           ) -> AsyncIterator[sqlite3.Connection]:
    conn = driver._connection
    assert conn is not None
    try:
        try:
            await driver._execute(conn.execute, "BEGIN IMMEDIATE")
            yield conn
            await driver._execute(conn.commit)
        except sqlite3.Error as exc:
            raise DBAPIError.instance("COMMIT", None, exc, sqlite3.Error) from exc
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            if writer is not None:
                writer.discard()
            elif conn.in_transaction:
                _rollback(conn)
            raise
        except BaseException:
            if conn.in_transaction and not _rollback(conn) and writer is not None:
                writer.discard()
            raise
    except IntegrityError as exc:
        if conn.in_transaction and not _rollback(conn) and writer is not None:
            writer.discard()
        raise UniqueViolation.from_db(exc) from exc
    except DBAPIError as exc:
        if writer is not None:
            writer.discard()
        elif conn.in_transaction:
            _rollback(conn)
        log.error("database transaction failed: %s", _short(exc))
        raise Unavailable("the database is unavailable; nothing was recorded",
                          code="storage_unavailable") from exc


@asynccontextmanager
async def _reference_pooled(db: Database) -> AsyncIterator[sqlite3.Connection | None]:
    fairy = await db.engine.raw_connection()
    try:
        driver = fairy.driver_connection
        if not isinstance(driver, InlineConnection) or driver._connection is None:
            yield None
            return
        async with _reference_begin(driver, None) as conn:
            yield conn
    finally:
        await greenlet_spawn(fairy.close)


@contextmanager
def _reference_read(database: Any, *, snapshot: bool = True
                    ) -> Iterator[sqlite3.Connection | None]:
    reader = raw_sql._reader(database)
    if reader is None or reader.busy or reader.thread != threading.get_ident():
        yield None
        return
    reader.busy = True
    try:
        try:
            conn = reader.connect()
            if snapshot:
                conn.execute("BEGIN")
        except sqlite3.Error as exc:
            reader.close()
            raise Unavailable("the database is unavailable",
                              code="storage_unavailable") from exc
        try:
            yield conn
        except DBAPIError as exc:
            raise Unavailable("the database is unavailable",
                              code="storage_unavailable") from exc
        finally:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error:
                reader.close()
    finally:
        reader.busy = False


# --- fixtures and the outcome compared ---------------------------------------------

@pytest.fixture
async def file_db(tmp_path: Path, sqlite_template: Path) -> AsyncIterator[Database]:
    """A migrated SQLite file with table ``w`` (busy timeout 200 ms)."""
    db = Database(migrated_database(tmp_path, "sqlite", None, sqlite_template),
                  busy_timeout_ms=200)
    async with db.transaction() as conn:
        await conn.exec_driver_sql("CREATE TABLE w (x INTEGER PRIMARY KEY)")
        await conn.exec_driver_sql(
            "CREATE TABLE c (p INTEGER REFERENCES w(x) DEFERRABLE INITIALLY DEFERRED)")
        await conn.exec_driver_sql("INSERT INTO w VALUES (1)")
    yield db
    await db.dispose()


def _reset(db: Database) -> None:
    conn = _other_process(db)
    try:
        conn.execute("DELETE FROM c")
        conn.execute("DELETE FROM w WHERE x <> 1")
    finally:
        conn.close()


def _in_transaction(conn: sqlite3.Connection | None) -> bool | str | None:
    if conn is None:
        return None
    try:
        return conn.in_transaction
    except sqlite3.ProgrammingError:
        return "closed"


def _error(exc: BaseException | None) -> tuple[Any, ...] | None:
    if exc is None:
        return None
    cause = exc.__cause__
    return (type(exc), getattr(exc, "code", None), str(exc), type(cause),
            type(getattr(cause, "orig", None)), type(getattr(cause, "__cause__", None)))


def _wrapped(driver_error: sqlite3.Error) -> DBAPIError:
    return DBAPIError.instance("SELECT 1", None, driver_error, sqlite3.Error)


Body = Callable[[sqlite3.Connection], None]


def _raise(exc: BaseException) -> Body:
    def body(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO w VALUES (2)")
        raise exc
    return body


def _run_sql(*statements: str) -> Body:
    def body(conn: sqlite3.Connection) -> None:
        for statement in statements:
            conn.execute(statement)
    return body


_BODIES: dict[str, Callable[[], Body]] = {
    "commits": lambda: _run_sql("INSERT INTO w VALUES (2)", "INSERT INTO w VALUES (3)"),
    "plain_error": lambda: _raise(ValueError("boom")),
    "driver_unique": lambda: _run_sql("INSERT INTO w VALUES (2)", "INSERT INTO w VALUES (1)"),
    "driver_operational": lambda: _run_sql("INSERT INTO w VALUES (2)", "SELECT nope FROM w"),
    "wrapped_unique": lambda: _raise(_wrapped(sqlite3.IntegrityError("UNIQUE failed"))),
    "wrapped_operational": lambda: _raise(_wrapped(sqlite3.OperationalError("disk I/O"))),
    "cancelled": lambda: _raise(asyncio.CancelledError()),
    "failed_commit": lambda: _run_sql("INSERT INTO w VALUES (2)", "INSERT INTO c VALUES (9)"),
    "rollback_fails": lambda: _raise_after_close(),
}


def _raise_after_close() -> Body:
    def body(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO w VALUES (2)")
        conn.close()  # the rollback (and the commit) then fail
        raise ValueError("closed")
    return body


Opener = Callable[[Database], AbstractAsyncContextManager[sqlite3.Connection | None]]


async def _outcome(db: Database, opener: Opener, body: Body, caplog: pytest.LogCaptureFixture,
                   setup: str) -> tuple[Any, ...]:
    writer = db.sqlite_write_connection
    assert writer is not None
    await writer.connection()  # a kept connection to keep or discard
    kept = writer._driver
    caplog.clear()
    error: BaseException | None = None
    other: sqlite3.Connection | None = None
    if setup == "pooled":
        assert writer.claim()  # in use from "another loop": the pooled connection serves
    elif setup == "locked":
        other = _other_process(db)
        other.execute("BEGIN IMMEDIATE")  # BEGIN IMMEDIATE then fails (busy timeout)
    elif setup == "unopenable":
        writer.discard()
    seen: sqlite3.Connection | None = None
    try:
        async with opener(db) as conn:
            seen = conn
            assert conn is not None
            body(conn)
    except BaseException as exc:  # noqa: BLE001 - compared below, whatever it is
        error = exc
    finally:
        if other is not None:
            other.rollback()
            other.close()
    busy = writer.busy
    if busy:
        writer.release()
    if _in_transaction(seen) == "closed" and writer._driver is kept:
        writer.discard()  # the body closed it: the next run opens another
    lock = db._write_locks[asyncio.get_running_loop()].lock
    await asyncio.sleep(0.02)  # a discarded connection's worker thread closes it
    state = (_error(error), _rows(db), busy, lock.locked(),
             writer._driver is kept if setup == "plain" else None,
             _in_transaction(seen),
             [(r.levelname, r.getMessage()) for r in caplog.records
              if r.name == "cosigner.db.database"])
    _reset(db)
    return state


@pytest.mark.parametrize(("case", "setup"), [
    (case, setup) for case in sorted(_BODIES) for setup in ("plain", "pooled")
    if (case, setup) != ("rollback_fails", "pooled")])  # a closed pooled one breaks the pool
async def test_raw_transaction_class_equals_the_generator(
        file_db: Database, caplog: pytest.LogCaptureFixture, case: str, setup: str) -> None:
    reference = await _outcome(file_db, _reference_transaction, _BODIES[case](), caplog, setup)
    ours = await _outcome(file_db, raw_transaction, _BODIES[case](), caplog, setup)
    assert ours == reference
    if case == "commits":
        assert reference[0] is None and reference[1] == [1, 2, 3]
    elif case != "cancelled":
        assert reference[0] is not None


@pytest.mark.parametrize("setup", ["locked", "unopenable"])
async def test_raw_transaction_class_equals_the_generator_on_entry(
        file_db: Database, caplog: pytest.LogCaptureFixture, setup: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    body = _BODIES["commits"]()
    if setup == "unopenable":
        async def refuse(self: WriterConnection) -> InlineConnection:
            raise sqlite3.OperationalError("unable to open database file")
        monkeypatch.setattr(WriterConnection, "connection", refuse)
        writer = file_db.sqlite_write_connection
        assert writer is not None
        writer_state = await _unopenable(file_db, body, caplog)
        assert writer_state[0] is not None and writer_state[0][0] is Unavailable
        return
    reference = await _outcome(file_db, _reference_transaction, body, caplog, setup)
    ours = await _outcome(file_db, raw_transaction, body, caplog, setup)
    assert ours == reference
    assert reference[0] is not None and reference[0][0] is Unavailable


async def _unopenable(db: Database, body: Body, caplog: pytest.LogCaptureFixture
                      ) -> tuple[Any, ...]:
    results = []
    for opener in (_reference_transaction, raw_transaction):
        caplog.clear()
        error: BaseException | None = None
        try:
            async with opener(db) as conn:
                body(conn)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001
            error = exc
        writer = db.sqlite_write_connection
        assert writer is not None
        results.append((_error(error), _rows(db), writer.busy,
                        db._write_locks[asyncio.get_running_loop()].lock.locked(),
                        [r.getMessage() for r in caplog.records]))
    assert results[0] == results[1]
    return results[0]


async def test_the_writer_queue_is_released_when_entry_is_cancelled(file_db: Database) -> None:
    """A batch cancelled while it waits in the writer queue leaves the queue and the
    connection as the generator form did (the holder still holds it, busy untouched)."""
    for opener in (_reference_transaction, raw_transaction):
        entered = asyncio.Event()
        release = asyncio.Event()

        async def holder(open_: Opener = opener, entered: asyncio.Event = entered,
                         release: asyncio.Event = release) -> None:
            async with open_(file_db):
                entered.set()
                await release.wait()

        async def waiter(open_: Opener = opener) -> None:
            async with open_(file_db):
                pass

        held = asyncio.create_task(holder())
        await entered.wait()
        waiting = asyncio.create_task(waiter())
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        writer = file_db.sqlite_write_connection
        assert writer is not None and writer.busy
        release.set()
        await held
        assert not writer.busy
        assert not file_db._write_locks[asyncio.get_running_loop()].lock.locked()


# --- read_connection ---------------------------------------------------------------

ReadOpener = Callable[..., Any]


def _read_outcome(db: Database, opener: ReadOpener, case: str) -> tuple[Any, ...]:
    reader = raw_sql._reader(db)
    assert reader is not None
    reader.close()
    error: BaseException | None = None
    seen: Any = "unset"
    if case == "begin_fails":
        reader.connect().execute("BEGIN")  # BEGIN within a transaction: refused
    try:
        with opener(db, snapshot=case != "no_snapshot") as conn:
            seen = conn
            if case == "nested":
                with opener(db) as inner:
                    seen = (conn is not None, inner)
            elif conn is not None:
                conn.execute("SELECT count(*) FROM w").fetchone()
                if case == "plain_error":
                    raise ValueError("boom")
                if case == "driver_error":
                    conn.execute("SELECT nope FROM w")
                if case == "wrapped_error":
                    raise _wrapped(sqlite3.OperationalError("disk I/O"))
                if case == "rollback_fails":
                    conn.close()
    except BaseException as exc:  # noqa: BLE001
        error = exc
    in_transaction = None if reader.conn is None else reader.conn.in_transaction
    state = (_error(error), reader.busy, reader.conn is None, in_transaction,
             seen if seen is None or isinstance(seen, tuple) else type(seen))
    reader.close()
    return state


_READ_CASES = ["ok", "no_snapshot", "plain_error", "driver_error", "wrapped_error",
               "rollback_fails", "begin_fails", "nested"]


@pytest.mark.parametrize("case", _READ_CASES)
async def test_read_connection_class_equals_the_generator(file_db: Database, case: str
                                                          ) -> None:
    reference = _read_outcome(file_db, _reference_read, case)
    assert _read_outcome(file_db, read_connection, case) == reference
    if case in ("ok", "no_snapshot"):
        assert reference[0] is None and reference[4] is sqlite3.Connection


async def test_read_connection_from_another_thread_or_when_not_a_file_is_none(
        file_db: Database) -> None:
    raw_sql._reader(file_db)  # made here: bound to this thread
    memory = SimpleNamespace(url="sqlite+aiosqlite:///:memory:", is_sqlite=True,
                             _busy_timeout_ms=0)
    for opener in (_reference_read, read_connection):
        seen: list[Any] = []

        def other_thread(open_: ReadOpener = opener, seen: list[Any] = seen) -> None:
            with open_(file_db) as conn:
                seen.append(conn)
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        with opener(memory) as conn:
            seen.append(conn)
        assert seen == [None, None]
