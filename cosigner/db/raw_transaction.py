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
from contextlib import asynccontextmanager

from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.util import greenlet_spawn

from cosigner.core.errors import Unavailable
from cosigner.db.database import Database, UniqueViolation, _short
from cosigner.db.sqlite_inline import InlineConnection, WriterConnection

log = logging.getLogger("cosigner.db.database")


@asynccontextmanager
async def raw_transaction(db: Database) -> AsyncIterator[sqlite3.Connection | None]:
    """One write transaction of ``db`` (a SQLite file) on its own ``sqlite3`` write
    connection, without SQLAlchemy's ``Connection``: the same writer queue
    (:meth:`Database._sqlite_writer`), ``BEGIN IMMEDIATE`` on the loop (handed to the
    worker thread only when another process holds the lock), ``COMMIT`` on the worker
    thread (fsync off the loop), rollback on any exception. Yields ``None`` (nothing
    begun) when the database is not served by :class:`InlineConnection`.

    The connection is the database's kept :class:`WriterConnection`; after a database
    error or an interrupted transaction it is discarded (closed on its own thread, a
    later batch opens a new one), never reused in an unknown state.

    Raises, like :meth:`Database.transaction`:
        UniqueViolation: a unique constraint fired.
        Unavailable: any other database failure (the driver error as ``__cause__``'s
            ``orig``), the commit included.
    """
    async with db._sqlite_writer():  # noqa: SLF001 - the same in-process writer queue
        writer = db.sqlite_write_connection
        if writer is None or writer.busy:  # not a file, or in use from another loop
            async with _pooled(db) as conn:
                yield conn
            return
        writer.busy = True
        try:
            try:
                driver = await writer.connection()
            except sqlite3.Error as exc:
                writer.discard()
                log.error("database transaction failed: %s: %s", type(exc).__name__, exc)
                raise Unavailable("the database is unavailable; nothing was recorded",
                                  code="storage_unavailable") from exc
            async with _transaction(driver, writer) as conn:
                yield conn
        finally:
            writer.busy = False


@asynccontextmanager
async def _transaction(driver: InlineConnection, writer: WriterConnection | None
                       ) -> AsyncIterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` on ``driver``; ``writer``: the kept connection
    it belongs to, discarded on a database error or an interruption (``None``: a pooled
    connection, which its pool resets)."""
    conn = driver._connection  # noqa: SLF001
    assert conn is not None
    try:
        try:
            await driver._execute(conn.execute, "BEGIN IMMEDIATE")  # noqa: SLF001
            yield conn
            await driver._execute(conn.commit)  # noqa: SLF001
        except sqlite3.Error as exc:
            raise DBAPIError.instance("COMMIT", None, exc, sqlite3.Error) from exc
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            # The COMMIT may still run on the worker thread: leave the connection to it.
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
            writer.discard()  # closing rolls back what is open
        elif conn.in_transaction:
            _rollback(conn)
        log.error("database transaction failed: %s", _short(exc))
        raise Unavailable("the database is unavailable; nothing was recorded",
                          code="storage_unavailable") from exc


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
        async with _transaction(driver, None) as conn:
            yield conn
    finally:
        await greenlet_spawn(fairy.close)
