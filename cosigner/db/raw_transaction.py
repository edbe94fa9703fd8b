"""One SQLite write transaction on the driver itself, for group-commit batches of
prepared writes (:func:`cosigner.db.batch.savepoint_runner` with ``RawHooks``).

SQLAlchemy's ``Connection`` (checkout, ``begin`` event, execution contexts, commit,
close) cost about 10 % of an allow decision's CPU at c=16 once the statements
themselves ran on the driver (bench/README.md, "The allow batch without SQLAlchemy").
The pool check-out that remained (a greenlet hop in, reset-on-return and a hop out) is
gone too: batches run on the database's kept write connection
(:class:`cosigner.db.sqlite_inline.WriterConnection`).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType

from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.util import greenlet_spawn

from cosigner.core.errors import Unavailable
from cosigner.db.database import Database, UniqueViolation, _short
from cosigner.db.sqlite_inline import InlineConnection, WriterConnection

log = logging.getLogger("cosigner.db.database")


class RawTransaction:
    """One write transaction of ``db`` (a SQLite file) on its own ``sqlite3`` write
    connection, without SQLAlchemy's ``Connection``: the same writer queue
    (:meth:`Database._sqlite_writer`), ``BEGIN IMMEDIATE`` on the loop (handed to the
    worker thread only when another process holds the lock), ``COMMIT`` on the worker
    thread (fsync off the loop), rollback on any exception. ``async with`` gives ``None``
    (nothing begun) when the database is not served by :class:`InlineConnection`.

    The connection is the database's kept :class:`WriterConnection`; after a database
    error or an interrupted transaction it is discarded (closed on its own thread, a
    later batch opens a new one), never reused in an unknown state.

    A class rather than an ``@asynccontextmanager``: the generator's ``__aenter__`` /
    ``__aexit__`` (``anext``, ``athrow``, the nested ``_transaction`` one) cost a few
    µs per batch on the allow path (bench/README.md, session 10);
    tests/db/test_raw_transaction_class.py drives both forms through the same faults.

    Raises, like :meth:`Database.transaction`:
        UniqueViolation: a unique constraint fired.
        Unavailable: any other database failure (the driver error as ``__cause__``'s
            ``orig``), the commit included.
    """

    __slots__ = ("_db", "_queue", "_writer", "_inner")
    _queue: AbstractAsyncContextManager[None]
    _inner: AbstractAsyncContextManager[sqlite3.Connection | None]

    def __init__(self, db: Database) -> None:
        self._db = db
        self._writer: WriterConnection | None = None

    async def __aenter__(self) -> sqlite3.Connection | None:
        db = self._db
        queue = self._queue = db._sqlite_writer()  # noqa: SLF001 - the same writer queue
        await queue.__aenter__()
        try:
            writer = db.sqlite_write_connection
            if writer is None or not writer.claim():  # not a file, or used by another loop
                pooled = self._inner = _pooled(db)
                return await pooled.__aenter__()
            self._writer = writer
            try:
                try:
                    driver = await writer.connection()
                except sqlite3.Error as exc:
                    writer.discard()
                    log.error("database transaction failed: %s: %s",
                              type(exc).__name__, exc)
                    raise Unavailable("the database is unavailable; nothing was recorded",
                                      code="storage_unavailable") from exc
                inner = self._inner = _Transaction(driver, writer)
                return await inner.__aenter__()
            except BaseException:
                writer.release()
                raise
        except BaseException as exc:
            await queue.__aexit__(type(exc), exc, exc.__traceback__)
            raise

    async def __aexit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            try:
                await self._inner.__aexit__(typ, exc, tb)
            finally:
                if self._writer is not None:
                    self._writer.release()
        except BaseException as failure:
            await self._queue.__aexit__(type(failure), failure, failure.__traceback__)
            raise
        await self._queue.__aexit__(typ, exc, tb)


#: The name the batch runner and the tests use.
raw_transaction = RawTransaction


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` on ``driver``; ``writer``: the kept connection
    it belongs to, discarded on a database error or an interruption (``None``: a pooled
    connection, which its pool resets)."""

    __slots__ = ("_driver", "_writer", "_conn")

    def __init__(self, driver: InlineConnection, writer: WriterConnection | None) -> None:
        conn = driver._connection  # noqa: SLF001
        assert conn is not None
        self._driver, self._writer, self._conn = driver, writer, conn

    async def __aenter__(self) -> sqlite3.Connection:
        conn = self._conn
        try:
            await self._driver._execute(conn.execute, "BEGIN IMMEDIATE")  # noqa: SLF001
        except BaseException as exc:
            self._failed(exc)
            raise
        return conn

    async def __aexit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc is not None:
            self._failed(exc)
            return
        if not self._conn.in_transaction:
            # SQLite rolled it back under the body (an ``OR ROLLBACK`` conflict, a full
            # disk, an I/O error whose exception the body caught): ``commit()`` would be
            # a silent no-op, and its writes answered as committed.
            self._failed(sqlite3.OperationalError("the transaction was rolled back "
                                                  "before its COMMIT"))
        try:
            await self._driver._execute(self._conn.commit)  # noqa: SLF001
        except BaseException as failure:
            self._failed(failure)
            raise

    def _failed(self, exc: BaseException) -> None:
        """Clean up after ``exc`` (from ``BEGIN``, the body or ``COMMIT``) and raise what
        the caller sees instead, or return when ``exc`` itself goes on."""
        conn, writer = self._conn, self._writer
        if isinstance(exc, sqlite3.Error):
            try:
                raise DBAPIError.instance("COMMIT", None, exc, sqlite3.Error) from exc
            except DBAPIError as wrapped:
                failure = wrapped
        elif isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, SystemExit)):
            # The COMMIT may still run on the worker thread: leave the connection to it.
            if writer is not None:
                writer.discard()
            elif conn.in_transaction:
                _rollback(conn)
            return
        else:
            if conn.in_transaction and not _rollback(conn) and writer is not None:
                writer.discard()
            if not isinstance(exc, DBAPIError):
                return
            failure = exc
        if isinstance(failure, IntegrityError):
            if conn.in_transaction and not _rollback(conn) and writer is not None:
                writer.discard()
            raise UniqueViolation.from_db(failure) from failure
        if writer is not None:
            writer.discard()  # closing rolls back what is open
        elif conn.in_transaction:
            _rollback(conn)
        log.error("database transaction failed: %s", _short(failure))
        raise Unavailable("the database is unavailable; nothing was recorded",
                          code="storage_unavailable") from failure


def _rollback(conn: sqlite3.Connection) -> bool:
    """Roll back on the loop thread; False when the rollback itself failed."""
    try:
        conn.rollback()
    except sqlite3.Error:
        return False
    return True


@asynccontextmanager
async def _pooled(db: Database) -> AsyncIterator[sqlite3.Connection | None]:
    """The transaction on a pooled connection (the kept one is in use by another event
    loop), or ``None`` when the database is not served by :class:`InlineConnection`."""
    fairy = await db.engine.raw_connection()
    try:
        driver = fairy.driver_connection
        if not isinstance(driver, InlineConnection) or driver._connection is None:  # noqa: SLF001
            yield None
            return
        async with _Transaction(driver, None) as conn:
            yield conn
    finally:
        await greenlet_spawn(fairy.close)
