"""SQLite connections for SQLAlchemy's aiosqlite dialect without a thread hop per call.

aiosqlite runs every call (cursor, execute, fetch, close) on a worker thread and wakes
the event loop when it finishes; SQLAlchemy makes about four such calls per statement.
On a 2-core machine each round trip costs ~100 µs of CPU, so one ``SELECT`` cost
469 µs of CPU against 78 µs when run directly (``bench/sqlite_driver.py``, figures in
bench/README.md, "SQLite driver").

:class:`InlineConnection` runs calls on the event loop thread instead, where SQLite
answers in microseconds (a statement never waits for I/O it did not ask for: reads come
from the page cache or the OS, WAL readers never wait for writers). The two calls that
can wait still go to the connection's worker thread:

* ``COMMIT``: with ``synchronous=FULL`` it waits for fsync (0.2 ms on this machine,
  tens of ms on slow disks) — the loop keeps serving meanwhile;
* ``BEGIN IMMEDIATE`` when another *process* holds the write lock: it is tried on the
  loop with ``busy_timeout`` 0 first, and only on ``SQLITE_BUSY`` handed to the thread,
  which waits up to the configured busy timeout. Writers of this process never meet
  here: :class:`cosigner.db.database.Database` queues them on an asyncio lock first.

Queries that scan many rows (audit export and search) use a plain aiosqlite engine
(:attr:`cosigner.db.database.Database.bulk_engine`) so they never hold the loop.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import aiosqlite


def _begins_write(args: tuple[Any, ...]) -> bool:
    return bool(args) and isinstance(args[0], str) and args[0].startswith("BEGIN IMMEDIATE")


class InlineConnection(aiosqlite.Connection):
    """An aiosqlite connection whose calls run on the caller's thread, except COMMIT and
    a ``BEGIN IMMEDIATE`` that has to wait for another process's write lock."""

    def __init__(self, connector: Callable[[], sqlite3.Connection], *,
                 busy_timeout_ms: int) -> None:
        super().__init__(connector, iter_chunk_size=64)
        self._busy_timeout_ms = int(busy_timeout_ms)
        #: ``busy_timeout`` is 0 between calls, not only for the first ``BEGIN IMMEDIATE``
        #: try (:meth:`WriterConnection.connection`): two PRAGMAs fewer per transaction.
        self._waits_never = False
        # A worker left behind by a connection that was never closed must not keep the
        # process alive (SQLAlchemy's aiosqlite dialect does the same).
        self._thread.daemon = True

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        conn = self._connection
        if not self._running or conn is None:
            raise ValueError("Connection closed")
        if fn == conn.commit:
            return await super()._execute(fn, *args, **kwargs)  # type: ignore[no-untyped-call]
        if _begins_write(args):
            if not self._waits_never:
                conn.execute("PRAGMA busy_timeout=0")
            try:
                return fn(*args, **kwargs)
            except sqlite3.OperationalError as exc:
                # The primary code: SQLITE_BUSY_RECOVERY, _SNAPSHOT, _TIMEOUT also wait.
                if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                    raise
            finally:
                if not self._waits_never:
                    conn.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms}")
            if self._waits_never:
                return await super()._execute(  # type: ignore[no-untyped-call]
                    _waiting, conn, self._busy_timeout_ms, fn, *args, **kwargs)
            return await super()._execute(fn, *args, **kwargs)  # type: ignore[no-untyped-call]
        return fn(*args, **kwargs)

    def never_wait_between_calls(self) -> None:
        """Keep ``busy_timeout`` at 0 except while a ``BEGIN IMMEDIATE`` waits for another
        process on the worker thread. Only for a connection in WAL mode that runs nothing
        but write transactions: once ``BEGIN IMMEDIATE`` holds the write lock, its
        statements, ``COMMIT`` (and the passive autocheckpoint after it) and ``ROLLBACK``
        take no lock that could be busy."""
        assert self._connection is not None
        self._connection.execute("PRAGMA busy_timeout=0")
        self._waits_never = True


def _waiting(conn: sqlite3.Connection, busy_timeout_ms: int, fn: Callable[..., Any],
             *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with ``busy_timeout`` ``busy_timeout_ms``, then 0 again (on
    the worker thread of a :meth:`InlineConnection.never_wait_between_calls` connection)."""
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    try:
        return fn(*args, **kwargs)
    finally:
        conn.execute("PRAGMA busy_timeout=0")


def inline_creator(path: str, *, busy_timeout_ms: int) -> Callable[[], InlineConnection]:
    """An ``async_creator`` for ``create_async_engine``: connections to the SQLite file
    ``path``, usable from the loop thread and from their worker thread."""

    def create() -> InlineConnection:
        connector = partial(sqlite3.connect, path, timeout=busy_timeout_ms / 1000,
                            check_same_thread=False)
        return InlineConnection(connector, busy_timeout_ms=busy_timeout_ms)

    return create


def sqlite_pragmas(dbapi_connection: Any, busy_timeout_ms: int) -> None:
    """Configure a fresh SQLite connection (``sqlite3`` or SQLAlchemy's adapter of it):
    autocommit mode (BEGIN is issued explicitly), WAL, ``foreign_keys=ON``,
    ``busy_timeout`` in ms, and ``synchronous=FULL`` (a commit is on disk before a
    decision is answered, DESIGN invariant 2)."""
    # Let us issue BEGIN ourselves (pysqlite's implicit BEGIN is DEFERRED).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()


class WriterConnection:
    """The write connection of one SQLite file, kept open between group-commit batches
    (:func:`cosigner.db.raw_transaction.raw_transaction`).

    A pool check-out per batch (greenlet hop, checkout and reset-on-return events) cost
    more than the batch's own statements at low concurrency (bench/README.md, issue 20).
    Writers of one process are already serialized by
    :meth:`cosigner.db.database.Database._sqlite_writer`, so one connection is enough; it
    holds no lock between batches (autocommit mode), so other processes write the file
    as before. :meth:`claim` takes it for one transaction; a caller that finds it taken
    (a second event loop on the same :class:`~cosigner.db.database.Database`, maybe on
    another thread: the writer queue is per loop) takes a pooled connection.
    """

    def __init__(self, path: str, *, busy_timeout_ms: int) -> None:
        self._create = inline_creator(path, busy_timeout_ms=busy_timeout_ms)
        self._busy_timeout_ms = busy_timeout_ms
        self._driver: InlineConnection | None = None
        # A lock, not a flag: the check and the take are one step even when two threads
        # (two loops) claim at once (tests/db/test_writer_connection.py).
        self._claimed = threading.Lock()
        #: Connections opened, for tests and metrics (a discard makes the next batch open one).
        self.opened = 0

    @property
    def busy(self) -> bool:
        """Claimed by a transaction (:meth:`claim`) right now."""
        return self._claimed.locked()

    def claim(self) -> bool:
        """Take the connection for one transaction: True when taken (give it back with
        :meth:`release`), False when another transaction holds it. Atomic across
        threads."""
        return self._claimed.acquire(blocking=False)

    def release(self) -> None:
        """Give back what :meth:`claim` took."""
        self._claimed.release()

    async def connection(self) -> InlineConnection:
        """The open connection, opened and configured first if there is none.

        Raises:
            sqlite3.Error: the file cannot be opened or configured.
        """
        driver = self._driver
        if driver is not None and driver._connection is not None and driver._running:
            return driver
        driver = self._create()
        await driver  # starts its worker thread and connects there
        try:
            assert driver._connection is not None
            sqlite_pragmas(driver._connection, self._busy_timeout_ms)
            mode = driver._connection.execute("PRAGMA journal_mode").fetchone()
            if mode is not None and str(mode[0]).lower() == "wal":
                driver.never_wait_between_calls()
        except BaseException:
            driver.stop()
            raise
        self._driver = driver
        self.opened += 1
        return driver

    def discard(self) -> None:
        """Close the connection after whatever its worker thread still runs (an
        interrupted COMMIT finishes or fails first; an open transaction rolls back on
        close); the next batch opens a new one. Never touches the ``sqlite3`` connection
        from this thread, so it is safe while a COMMIT is in flight."""
        driver, self._driver = self._driver, None
        if driver is not None and driver._running:
            driver.stop()

    async def close(self) -> None:
        """Close the connection (on dispose); a later batch opens a new one."""
        driver, self._driver = self._driver, None
        if driver is not None and driver._running:
            future = driver.stop()
            if future is not None:
                await future
