"""One SQLite write transaction on the driver itself, for group-commit batches of
prepared writes (:func:`cosigner.db.batch.savepoint_runner` with ``RawHooks``).

SQLAlchemy's ``Connection`` (checkout, ``begin`` event, execution contexts, commit,
close) cost about 10 % of an allow decision's CPU at c=16 once the statements
themselves ran on the driver (bench/README.md, "The allow batch without SQLAlchemy").
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.util import greenlet_spawn

from cosigner.core.errors import Unavailable
from cosigner.db.database import Database, UniqueViolation, _short
from cosigner.db.sqlite_inline import InlineConnection

log = logging.getLogger("cosigner.db.database")


@asynccontextmanager
async def raw_transaction(db: Database) -> AsyncIterator[sqlite3.Connection | None]:
    """One write transaction of ``db`` (a SQLite file) on a pooled connection's own
    ``sqlite3`` connection, without SQLAlchemy's ``Connection``: the same writer queue
    (:meth:`Database._sqlite_writer`), ``BEGIN IMMEDIATE`` on the loop (handed to the
    worker thread only when another process holds the lock), ``COMMIT`` on the worker
    thread (fsync off the loop), rollback on any exception. Yields ``None`` (nothing
    begun) when the database is not served by :class:`InlineConnection`.

    Raises, like :meth:`Database.transaction`:
        UniqueViolation: a unique constraint fired.
        Unavailable: any other database failure (the driver error as ``__cause__``'s
            ``orig``), the commit included.
    """
    async with db._sqlite_writer():  # noqa: SLF001 - the same in-process writer queue
        fairy = await db.engine.raw_connection()
        try:
            driver = fairy.driver_connection
            if not isinstance(driver, InlineConnection) or driver._connection is None:  # noqa: SLF001
                yield None
                return
            conn = driver._connection  # noqa: SLF001
            try:
                try:
                    await driver._execute(conn.execute, "BEGIN IMMEDIATE")  # noqa: SLF001
                    yield conn
                    await driver._execute(conn.commit)  # noqa: SLF001
                except sqlite3.Error as exc:
                    raise DBAPIError.instance("COMMIT", None, exc, sqlite3.Error) from exc
                except BaseException:
                    if conn.in_transaction:
                        try:
                            conn.rollback()
                        except sqlite3.Error:
                            pass
                    raise
            except IntegrityError as exc:
                raise UniqueViolation.from_db(exc) from exc
            except DBAPIError as exc:
                if conn.in_transaction:
                    try:
                        conn.rollback()
                    except sqlite3.Error:
                        pass
                log.error("database transaction failed: %s", _short(exc))
                raise Unavailable("the database is unavailable; nothing was recorded",
                                  code="storage_unavailable") from exc
        finally:
            await greenlet_spawn(fairy.close)
