"""Engine and transaction setup; the one place SQLAlchemy errors become domain errors.

SQLite (embedded default): WAL, ``foreign_keys=ON``, ``busy_timeout``, and
``BEGIN IMMEDIATE`` for every transaction so writers queue on the lock instead of
failing on upgrade ("database is locked", case K23). PostgreSQL: READ COMMITTED with
row locks / conditional updates in the repositories.

A database that cannot be reached or written raises :class:`cosigner.core.errors.Unavailable`
(HTTP 503, which clients treat as deny).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from sqlalchemy import event, make_url, text
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from cosigner.core.errors import Conflict, Unavailable
from cosigner.db.raw_sql import close_reader
from cosigner.db.sqlite_inline import WriterConnection, inline_creator, sqlite_pragmas

log = logging.getLogger("cosigner.db")


@functools.cache
def dialect_insert(dialect: str) -> Callable[..., Any]:
    """The ``insert()`` construct with ``ON CONFLICT`` of ``dialect`` (``"postgresql"``;
    anything else: SQLite's), imported on first use: a server on SQLite never loads the
    PostgreSQL dialect (~2.3 MB resident, issue 20), nor one on PostgreSQL SQLite's."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert

class UniqueViolation(Conflict):
    """A unique constraint fired (e.g. a concurrent insert of the same key).

    The detail is generic: constraint and column names stay in the server log.
    """

    code = "conflict"

    @classmethod
    def from_db(cls, exc: BaseException) -> UniqueViolation:
        log.info("unique constraint: %s", _short(exc))
        return cls("the record already exists (a concurrent or repeated request)")


#: PostgreSQL aborts one of two transactions that wait on each other (deadlock_detected,
#: serialization_failure); nothing of the aborted one was written, so it may run again.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})


class TransientConflict(Unavailable):
    """The database aborted the transaction to break a lock cycle; running it again is
    safe. Still an :class:`Unavailable` (503) for callers that do not retry."""


def _json_text(value: Any) -> str:
    """JSON columns' text: orjson (C) for what it takes, the stdlib for the rest (keys
    that are not strings, integers beyond 64 bits). Storage only: hashes are computed
    over RFC 8785 bytes elsewhere, never over this text."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value)


class Database:
    """An async engine plus the transaction helper every use case goes through."""

    def __init__(self, url: str, *, pool_size: int | None = None,
                 busy_timeout_ms: int = 10_000) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        self._busy_timeout_ms = busy_timeout_ms
        #: Closers of connections opened beside the engine (cosigner.db.raw_pg), run by
        #: :meth:`dispose`.
        self.on_dispose: list[Callable[[], Awaitable[None]]] = []
        self._write_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                     _WriteQueue] = weakref.WeakKeyDictionary()
        #: The kept write connection of a SQLite file (group-commit batches,
        #: :func:`cosigner.db.raw_transaction.raw_transaction`); ``None`` otherwise.
        self.sqlite_write_connection: WriterConnection | None = None
        if not self.is_sqlite:
            size = pool_size or 10
            self.engine: AsyncEngine = create_async_engine(
                url, pool_size=size, max_overflow=size, pool_pre_ping=True, pool_timeout=5,
                json_serializer=_json_text)
            self.bulk_engine = self.engine
            return
        # A kept pool: the default (5, overflow closed on check-in) made concurrent requests
        # open connections (a thread + PRAGMAs each) again and again. Statements no longer
        # yield mid-read, so 8 suffice; each holds its own page cache (memory).
        size = pool_size or 8
        pooling: dict[str, Any] = {"pool_size": size, "max_overflow": size,
                                   "pool_timeout": busy_timeout_ms / 1000,
                                   "json_serializer": _json_text}
        path = make_url(url).database or ""
        if path and path != ":memory:":
            # Statements on the loop thread, COMMIT and lock waits on aiosqlite's thread.
            self.engine = create_async_engine(
                url, async_creator=inline_creator(path, busy_timeout_ms=busy_timeout_ms),
                **pooling)
            self.sqlite_write_connection = WriterConnection(
                path, busy_timeout_ms=busy_timeout_ms)
        else:
            self.engine = create_async_engine(
                url, connect_args={"timeout": busy_timeout_ms / 1000}, **pooling)
        # Long scans (audit export and search) stay off the loop thread.
        self.bulk_engine = create_async_engine(
            url, connect_args={"timeout": busy_timeout_ms / 1000}, pool_size=4,
            max_overflow=4, pool_timeout=busy_timeout_ms / 1000, json_serializer=_json_text)
        _configure_sqlite(self.engine, busy_timeout_ms)
        _configure_sqlite(self.bulk_engine, busy_timeout_ms)

    @asynccontextmanager
    async def _sqlite_writer(self) -> AsyncIterator[None]:
        """One write transaction of this process at a time on SQLite (it has one writer
        anyway): writers queue here in order instead of polling the file lock. Waiting
        longer than the busy timeout is an outage, like SQLITE_BUSY."""
        if not self.is_sqlite:
            yield
            return
        loop = asyncio.get_running_loop()
        queue = self._write_locks.get(loop)
        if queue is None:
            queue = self._write_locks[loop] = _WriteQueue()
        lock = queue.lock
        try:
            if lock.locked() or queue.waiting:
                # Held, or just released to a writer that has not run yet (asyncio.Lock
                # is fair: acquire() queues behind it): wait, at most the busy timeout.
                queue.waiting += 1
                try:
                    async with asyncio.timeout(self._busy_timeout_ms / 1000):
                        await lock.acquire()
                finally:
                    queue.waiting -= 1
            else:  # free and nobody queued: taken without suspending, no timer needed
                await lock.acquire()
        except TimeoutError:
            log.error("database transaction failed: write lock wait expired")
            raise Unavailable("the database is busy; nothing was recorded",
                              code="storage_unavailable") from None
        try:
            yield
        finally:
            lock.release()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """One transaction: commits on normal exit, rolls back on any exception.

        Raises:
            Unavailable: the database cannot be reached or the commit failed.
            UniqueViolation: a unique constraint fired.
        """
        try:
            async with self._sqlite_writer(), self.engine.begin() as conn:
                yield conn
        except IntegrityError as exc:
            raise UniqueViolation.from_db(exc) from exc
        except (SQLAlchemyError, OSError, ConnectionError) as exc:
            raise failed_transaction(
                exc, getattr(getattr(exc, "orig", None), "sqlstate", None)) from exc

    @asynccontextmanager
    async def read(self, *, bulk: bool = False) -> AsyncIterator[AsyncConnection]:
        """A read-only snapshot (SQLite: deferred BEGIN, so readers never queue on writers).

        ``bulk``: the reads scan many rows (audit export, search); on SQLite they run on
        a worker thread so the event loop keeps answering decisions meanwhile.

        Raises:
            Unavailable: the database cannot be reached.
        """
        try:
            async with (self.bulk_engine if bulk else self.engine).connect() as conn:
                await conn.execution_options(cosigner_read=True)
                yield conn
                await conn.rollback()
        except (SQLAlchemyError, OSError, ConnectionError) as exc:
            log.error("database read failed: %s", _short(exc))
            raise Unavailable("the database is unavailable", code="storage_unavailable") from exc

    async def ping(self) -> bool:
        """True when a trivial query succeeds."""
        try:
            async with self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            return True
        except (SQLAlchemyError, OSError, ConnectionError):
            return False

    async def dispose(self) -> None:
        close_reader(self)  # the raw read connection (cosigner.db.raw_sql), if opened
        for close in self.on_dispose:
            await close()
        if self.sqlite_write_connection is not None:
            await self.sqlite_write_connection.close()
        await self.engine.dispose()
        if self.bulk_engine is not self.engine:
            await self.bulk_engine.dispose()


class _WriteQueue:
    """The write lock of one event loop (:meth:`Database._sqlite_writer`) and how many
    writers wait on it: ``asyncio.Lock`` says whether it is held, not whether a writer is
    queued (its ``_waiters`` is private); every acquire goes through ``_sqlite_writer``,
    so this count is exact."""

    __slots__ = ("lock", "waiting")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.waiting = 0


def _short(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    return f"{type(orig or exc).__name__}: {str(orig or exc).splitlines()[0][:200]}"


def _configure_sqlite(engine: AsyncEngine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        sqlite_pragmas(dbapi_connection, busy_timeout_ms)

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        read_only = conn.get_execution_options().get("cosigner_read", False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def failed_transaction(exc: BaseException, sqlstate: str | None
                       ) -> TransientConflict | Unavailable:
    """What a failed write transaction raises (``from exc``), logged: a lock cycle or
    serialization failure (``sqlstate`` in :data:`RETRYABLE_SQLSTATES`) is a
    :class:`TransientConflict` (run it again), anything else :class:`Unavailable`
    (``storage_unavailable``, 503); nothing was recorded either way."""
    if sqlstate in RETRYABLE_SQLSTATES:
        log.warning("database transaction aborted: %s", _short(exc))
        return TransientConflict("the transaction was aborted by a lock conflict; "
                                 "nothing was recorded", code="storage_unavailable")
    log.error("database transaction failed: %s", _short(exc))
    return Unavailable("the database is unavailable; nothing was recorded",
                       code="storage_unavailable")
