"""The group-commit allow batch on PostgreSQL through asyncpg itself (issue 20).

SQLAlchemy Core costs an execution context, parameter and result processing, a greenlet
hop and a pool check-out (with its pre-ping round trip) around every statement; on
PostgreSQL that was most of an allow decision's server CPU. A batch of prepared writes
(:class:`cosigner.db.batch.Write`) runs here instead, on the committer's own asyncpg
connection (:class:`PgLink`, opened from the engine's URL with the dialect's own connect
arguments): ``BEGIN``, the guard's reads, one ``executemany`` per table and key set, the
chain heads (``SELECT … FOR UPDATE`` in sorted tenant order, after every other write, so
the lock is held for the events, the head update and the ``COMMIT`` only), ``COMMIT``.
The same statements, rows and lock order as the SQLAlchemy path; a redo item by item
still takes that path (:func:`cosigner.db.batch.savepoint_runner`).

Every SQL text the raw PostgreSQL path sends is in this module (the table layout lives in
:mod:`cosigner.db.tables`; inserts are built from it and the rows' keys). Values go
through the bind processors SQLAlchemy's asyncpg dialect applies (JSON text, compressed
columns), so rows written either way are identical; asyncpg's own codecs then take
them (``json``: text, as SQLAlchemy's codec; ``timestamptz``: aware datetimes).

Errors are mapped as :meth:`cosigner.db.database.Database.transaction` maps SQLAlchemy's:
a unique key → :class:`UniqueViolation` (the batch is redone item by item), a deadlock or
serialization failure → :class:`TransientConflict` (run again), any other database error
→ :class:`Unavailable` whose ``__cause__`` is the SQLAlchemy ``DBAPIError`` subclass
SQLAlchemy would have raised (``OperationalError`` for a lost connection: an outage, 503
at once; ``DataError`` …: one item's value, redo item by item).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from sqlalchemy import Table
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Dialect

from cosigner.core.errors import Unavailable
from cosigner.db.database import (
    RETRYABLE_SQLSTATES,
    Database,
    TransientConflict,
    UniqueViolation,
    _short,
)
from cosigner.db.raw_insert import sqlite_rows
from cosigner.db.tables import decisions

log = logging.getLogger("cosigner.db.raw_pg")

#: SQLAlchemy's connect arguments that asyncpg.connect does not take.
_SQLALCHEMY_ONLY = ("prepared_statement_cache_size", "prepared_statement_name_func",
                    "async_fallback")


class PgLink:
    """One asyncpg connection of one group committer (one batch at a time), opened on first
    use from ``db``'s engine URL and connect arguments, reopened after a connection error,
    closed by :meth:`Database.dispose`."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.conn: asyncpg.Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._registered = False

    @property
    def enabled(self) -> bool:
        """True when ``db`` is PostgreSQL through asyncpg."""
        dialect = self.db.engine.dialect
        return dialect.name == "postgresql" and dialect.driver == "asyncpg"

    async def connect(self) -> asyncpg.Connection:
        """The open connection, (re)connected when needed.

        Raises:
            Unavailable ``storage_unavailable``: PostgreSQL cannot be reached.
        """
        loop = asyncio.get_running_loop()
        if self.conn is not None and (self.conn.is_closed() or self._loop is not loop):
            self._drop()
        if self.conn is None:
            engine = self.db.engine
            cargs, cparams = engine.dialect.create_connect_args(engine.url)
            for name in _SQLALCHEMY_ONLY:
                cparams.pop(name, None)
            try:
                self.conn = await asyncpg.connect(*cargs, **cparams)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.error("database transaction failed: %s: %s", type(exc).__name__, exc)
                raise Unavailable("the database is unavailable; nothing was recorded",
                                  code="storage_unavailable") from exc
            self._loop = loop
            if not self._registered:
                self.db.on_dispose.append(self.close)
                self._registered = True
        return self.conn

    def _drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and not conn.is_closed():
            try:
                await asyncio.wait_for(conn.close(), 5)
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
                conn.terminate()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        """``BEGIN`` … ``COMMIT`` (rolled back on any exception) on the link's connection.

        Raises, like :meth:`Database.transaction`:
            UniqueViolation: a unique constraint fired.
            TransientConflict: PostgreSQL aborted the transaction (deadlock, serialization).
            Unavailable: any other database failure, the commit included.
        """
        conn = await self.connect()
        try:
            try:
                await conn.execute(_BEGIN)
            except (OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError):
                # A connection that died while idle (server restart): once more on a new
                # one, as the engine's pre-ping would.
                self._drop()
                conn = await self.connect()
                await conn.execute(_BEGIN)
            try:
                yield conn
                await conn.execute("COMMIT")
            except BaseException:
                if not conn.is_closed() and conn.is_in_transaction():
                    try:
                        await conn.execute("ROLLBACK")
                    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                        self._drop()
                raise
        except asyncpg.UniqueViolationError as exc:
            raise UniqueViolation.from_db(_sqlalchemy_error(exc)) from exc
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            error = _sqlalchemy_error(exc)
            if error.connection_invalidated:
                self._drop()
            if getattr(exc, "sqlstate", None) in RETRYABLE_SQLSTATES:
                log.warning("database transaction aborted: %s", _short(error))
                raise TransientConflict("the transaction was aborted by a lock conflict; "
                                        "nothing was recorded",
                                        code="storage_unavailable") from error
            log.error("database transaction failed: %s", _short(error))
            raise Unavailable("the database is unavailable; nothing was recorded",
                              code="storage_unavailable") from error
        try:
            await conn.execute(_FLUSH)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # Committed, perhaps not on disk: never acknowledged; an outage (cause not a
            # DBAPIError), so the batch is not redone.
            self._drop()
            log.error("database flush failed: %s: %s", type(exc).__name__, exc)
            raise Unavailable("the database could not confirm the write",
                              code="storage_unavailable") from exc


#: The batch commits without waiting for the WAL flush (``synchronous_commit`` off for
#: this transaction only), so its chain-head row locks are released at COMMIT instead of
#: after the fsync: the other replica's batch extends the chain meanwhile. Nothing is
#: acknowledged before :data:`_FLUSH` returns.
_BEGIN = "BEGIN; SET LOCAL synchronous_commit TO off"
#: A transaction that writes WAL (a transactional logical message, callable by any role)
#: and commits under the server's own ``synchronous_commit`` (on): its COMMIT flushes the
#: WAL up to its commit record, which lies after the batch's, so when it returns the batch
#: is on disk (and on synchronous standbys) exactly as a synchronous COMMIT would have it.
#: Flushes of both replicas share fsyncs (PostgreSQL's own group commit).
_FLUSH = "BEGIN; SELECT pg_logical_emit_message(true, 'cosigner', 'flush'); COMMIT"


def _sqlalchemy_error(exc: BaseException) -> sa_exc.DBAPIError:
    """The SQLAlchemy exception SQLAlchemy's asyncpg adapter would raise for ``exc``
    (``orig`` is the asyncpg error, with its ``sqlstate``)."""
    if isinstance(exc, asyncpg.IntegrityConstraintViolationError):
        cls: type[sa_exc.DBAPIError] = sa_exc.IntegrityError
    elif isinstance(exc, asyncpg.DataError):
        cls = sa_exc.DataError
    elif isinstance(exc, asyncpg.PostgresError) and not isinstance(
            exc, (asyncpg.PostgresConnectionError, asyncpg.InsufficientResourcesError,
                  asyncpg.OperatorInterventionError, asyncpg.PostgresSystemError,
                  asyncpg.TransactionRollbackError)):
        cls = sa_exc.ProgrammingError
    else:
        cls = sa_exc.OperationalError
    lost = isinstance(exc, (OSError, asyncpg.InterfaceError,
                            asyncpg.PostgresConnectionError,
                            asyncpg.OperatorInterventionError))
    return cls(None, None, exc, connection_invalidated=lost)  # type: ignore[arg-type]


# -- inserts ----------------------------------------------------------------------------

_NUMBERED: dict[str, str] = {}


def _numbered(sql: str) -> str:
    """``VALUES (?, ?, …)`` → ``VALUES ($1, $2, …)`` (the SQL holds no other ``?``)."""
    out = _NUMBERED.get(sql)
    if out is None:
        parts = sql.split("?")
        out = _NUMBERED[sql] = "".join(
            f"{part}${i}" for i, part in enumerate(parts[:-1], 1)) + parts[-1]
    return out


async def insert_rows(conn: asyncpg.Connection, dialect: Dialect, table: Table,
                      rows: Sequence[dict[str, Any]]) -> None:
    """``INSERT`` ``rows`` (each with the first row's keys) into ``table``: one prepared
    statement, every row in one pipelined ``executemany``. Values through the dialect's
    bind processors (:func:`cosigner.db.raw_insert.sqlite_rows` with the PostgreSQL
    dialect). Raises asyncpg's errors (mapped by :meth:`PgLink.transaction`)."""
    if rows:
        sql, params = sqlite_rows(dialect, table, rows)
        await conn.executemany(_numbered(sql), params)


# -- the guard's reads (pdp.decision_log_writer's confirm) ------------------------------

_DECIDED = ("SELECT request_id, request_hash, response FROM decisions "
            "WHERE tenant = $1 AND request_id = ANY($2::varchar[])")
_CONTRACTED = "SELECT tenant, run_id FROM runs WHERE run_id = ANY($1::varchar[])"
_REJECTED = ("SELECT tenant, run_id, tool, args_hash FROM approvals "
             "WHERE tenant = ANY($1::varchar[]) AND run_id = ANY($2::varchar[]) "
             "AND status = 'rejected' AND withdrawn_at IS NULL")


async def decided(conn: asyncpg.Connection, dialect: Dialect,
                  requests: set[tuple[str, str]]) -> dict[tuple[str, str], tuple[Any, ...]]:
    """``pdp._decided``: ``{(tenant, request_id): (request_id, request_hash, response)}``
    of those already decided, one query per tenant on the unique key."""
    by_tenant: dict[str, list[str]] = {}
    for tenant, request_id in requests:
        by_tenant.setdefault(tenant, []).append(request_id)
    load = decisions.c.response.type.dialect_impl(dialect).result_processor(dialect, None)
    found: dict[tuple[str, str], tuple[Any, ...]] = {}
    for tenant, ids in sorted(by_tenant.items()):
        for request_id, request_hash, response in await conn.fetch(_DECIDED, tenant, ids):
            found[(tenant, request_id)] = (request_id, request_hash,
                                           load(response) if load else response)
    return found


async def contracted(conn: asyncpg.Connection, pairs: set[tuple[str, str]]
                     ) -> set[tuple[str, str]]:
    """``contracts.contracted``: which ``(tenant, run_id)`` pairs have a run contract."""
    rows = await conn.fetch(_CONTRACTED, sorted({run_id for _, run_id in pairs}))
    return {(tenant, run_id) for tenant, run_id in rows} & pairs


async def rejected_calls(conn: asyncpg.Connection, calls: set[tuple[str, str, str, str]]
                         ) -> set[tuple[str, str, str, str]]:
    """``rejections.rejected_calls``: which ``(tenant, run_id, tool, args_hash)`` calls
    have a standing (not withdrawn) rejection."""
    rows = await conn.fetch(_REJECTED, sorted({c[0] for c in calls}),
                            sorted({c[1] for c in calls}))
    return {(t, r, tool, h) for t, r, tool, h in rows} & calls


# -- the chain head (audit.chain.append_pg) ---------------------------------------------

_HEAD = "SELECT seq, hash FROM audit_heads WHERE tenant = $1 FOR UPDATE"
_NEW_HEAD = ("INSERT INTO audit_heads (tenant, seq, hash) VALUES ($1, 0, $2) "
             "ON CONFLICT (tenant) DO NOTHING")
_MOVE_HEAD = "UPDATE audit_heads SET seq = $1, hash = $2 WHERE tenant = $3"


async def lock_head(conn: asyncpg.Connection, tenant: str, genesis: str) -> tuple[int, str]:
    """``tenant``'s chain head ``(seq, hash)``, row-locked until the transaction ends
    (created at ``genesis`` the first time)."""
    row = await conn.fetchrow(_HEAD, tenant)
    if row is None:
        await conn.execute(_NEW_HEAD, tenant, genesis)
        row = await conn.fetchrow(_HEAD, tenant)
        assert row is not None
    return int(row[0]), str(row[1])


async def move_head(conn: asyncpg.Connection, tenant: str, seq: int, digest: str) -> None:
    """Set ``tenant``'s (locked) head to ``(seq, digest)``."""
    await conn.execute(_MOVE_HEAD, seq, digest, tenant)
