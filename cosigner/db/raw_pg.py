"""The group-commit allow batch on PostgreSQL through asyncpg itself (issue 20).

SQLAlchemy Core costs an execution context, parameter and result processing, a greenlet
hop and a pool check-out (with its pre-ping round trip) around every statement; on
PostgreSQL that was most of an allow decision's server CPU. A batch of prepared writes
(:class:`cosigner.db.batch.Write`) runs here instead, on the committer's own asyncpg
connection (:class:`PgLink`, opened from the engine's URL with the dialect's own connect
arguments), in seven round trips:

1. ``BEGIN``;
2. the guard's three reads, one statement (:func:`guard_reads`);
3. every row of every table, one ``INSERT … SELECT … FROM unnest($1::table[])`` statement
   (:func:`insert_tables`);
4. per tenant in sorted order, after every other write: the chain head
   ``SELECT … FOR UPDATE`` (:func:`lock_head`), then
5. the events and the head move, one statement (:func:`extend_chain`);
6. ``COMMIT`` (synchronous: the batch is on disk before any of it is acknowledged,
   DESIGN invariant 2).

Every batch of a tenant, on every replica, locks that tenant's chain head, and PostgreSQL
holds the row lock until the commit's WAL flush: the replicas' batches of one tenant
queue one fsync after another. Committing with ``synchronous_commit`` off and
acknowledging after a later synchronous flush was tried (session 5) and not kept: a
retried request id read by another replica between the two could be answered from rows
not yet on disk, and no throughput gain was measured on this machine.

Each statement is prepared once per connection and runs on its generic plan (the
connection's ``plan_cache_mode``), written so that this plan probes the unique keys
even when it was made on a fresh, empty database (see the guard's note).

The same rows, lock order and redo semantics as the SQLAlchemy path; a redo item by item
takes that path (:func:`cosigner.db.batch.savepoint_runner`). Every SQL text the raw
PostgreSQL path sends is in this module; inserts are built from the table metadata
(:mod:`cosigner.db.tables`) and the rows' keys, values through the bind processors of
SQLAlchemy's asyncpg dialect (JSON text, compressed columns;
:mod:`cosigner.db.row_encoders`), so rows written either way
are identical (tests/decisions/test_raw_pg.py).

Errors are mapped as :meth:`cosigner.db.database.Database.transaction` maps SQLAlchemy's:
a unique key → :class:`UniqueViolation` (the batch is redone item by item), a deadlock or
serialization failure → :class:`TransientConflict` (run again), any other database error
→ :class:`Unavailable` whose ``__cause__`` is the SQLAlchemy ``DBAPIError`` subclass
SQLAlchemy would have raised (``OperationalError`` for a lost connection: an outage, 503
at once; ``DataError`` …: one item's value, redo item by item).
A failed COMMIT is an outage (503; the batch may be on disk, like any COMMIT whose answer
was lost). A COMMIT that PostgreSQL answers ``ROLLBACK`` (the transaction was aborted by
an error the body caught) is never taken for a commit: it raises :class:`Unavailable`
whose cause is a ``ProgrammingError`` (``InFailedSQLTransaction``), so the batch runner
redoes the batch item by item on the SQLAlchemy path, each item answered after its own
COMMIT (tests/db/test_commit_scheduling.py; on SQLite the same case is an
``OperationalError``: 503 at once).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Table
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Dialect

from cosigner.core.errors import Unavailable
from cosigner.db import response_row
from cosigner.db.compressed import RowBound
from cosigner.db.database import Database, UniqueViolation, failed_transaction
from cosigner.db.row_encoders import table_encoders
from cosigner.db.tables import decisions

if TYPE_CHECKING:  # imported where a PostgreSQL batch runs: SQLite servers never load it
    import asyncpg

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
        import asyncpg
        loop = asyncio.get_running_loop()
        if self.conn is not None and (self.conn.is_closed() or self._loop is not loop):
            self._drop()
        if self.conn is None:
            engine = self.db.engine
            cargs, cparams = engine.dialect.create_connect_args(engine.url)
            size = cparams.get("prepared_statement_cache_size")
            if size is not None:  # e.g. 0 behind a transaction-pooling PgBouncer
                cparams["statement_cache_size"] = int(size)
            for name in _SQLALCHEMY_ONLY:
                cparams.pop(name, None)
            try:
                conn = await asyncpg.connect(*cargs, **cparams)
                if cparams.get("statement_cache_size", 1):
                    await _keep_generic_plans(conn)
                self.conn = conn
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
        import asyncpg
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
        import asyncpg
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
                if await conn.execute("COMMIT") != "COMMIT":
                    # An aborted transaction (a statement failed and the body caught its
                    # error): PostgreSQL answers ROLLBACK, and asyncpg raises nothing.
                    raise asyncpg.InFailedSQLTransactionError(
                        "the transaction was aborted; its COMMIT rolled back")
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
            elif isinstance(exc, asyncpg.PostgresError) and not conn.is_closed():
                # Perhaps a table changed under the cached row types (a migration by
                # another process): the next batch reads them again.
                _FIELDS.pop(conn, None)
                _LAYOUTS.pop(conn, None)
                await conn.reload_schema_state()
            raise failed_transaction(error, getattr(exc, "sqlstate", None)) from error


#: Run once on each link connection that keeps prepared statements (asyncpg's statement
#: cache; not behind a transaction-pooling PgBouncer, where a SET would outlive the
#: connection's turn): each statement is planned once, when first prepared, and that
#: plan kept. Left to PostgreSQL, a statement whose custom plan looks cheaper than its
#: generic one (the guard's reads: arrays of 1–10 keys against ``unnest``'s estimate of
#: 10) was planned again on every batch, ~440 µs of server CPU each (56 µs per decision
#: at 8 a batch). Every statement here is written so that its generic plan is the right
#: one whatever the tables hold (see the guard's note).
_GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"

async def _keep_generic_plans(conn: asyncpg.Connection) -> None:
    """:data:`_GENERIC_PLANS` on a new link connection. A server that refuses it (before
    PostgreSQL 12, or a pooler that forbids SET) keeps its own choice: logged, not an
    error. Raises the connection's errors (closed first)."""
    import asyncpg
    try:
        await conn.execute(_GENERIC_PLANS)
    except asyncpg.PostgresError as exc:
        log.warning("plan_cache_mode not set on the batch connection: %s: %s",
                    type(exc).__name__, exc)
    except BaseException:
        conn.terminate()
        raise


#: The batch transaction's first statement (commits under the server's own, synchronous,
#: ``synchronous_commit``).
_BEGIN = "BEGIN"


def _sqlalchemy_error(exc: BaseException) -> sa_exc.DBAPIError:
    """The SQLAlchemy exception SQLAlchemy's asyncpg adapter would raise for ``exc``
    (``orig`` is the asyncpg error, with its ``sqlstate``)."""
    import asyncpg
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
    return cls(None, None, exc, connection_invalidated=lost)


# -- inserts ----------------------------------------------------------------------------
#
# Rows go in as one array of the table's own row type per table (``INSERT INTO t (keys)
# SELECT keys FROM unnest($1::t[])``): one statement for all rows of several tables
# (data-modifying CTEs), one round trip. Each row is a tuple in the table's column order
# (as PostgreSQL has it: :func:`_fields`, read once per connection), ``None`` for a
# column the rows do not set, which the INSERT leaves to its default. Each field is
# received with its column's type modifier, so a value too long for a ``varchar(36)`` is
# refused as a row insert refuses it (``string_data_right_truncation``, a DataError).
#
# Session 10: this replaced one array per column (``unnest($1::varchar[], …)``): asyncpg
# checks every element of an array for being a sub-array (two ``collections.abc``
# ``isinstance`` calls per string or bytes value, Python-level ``__instancecheck__``),
# ~60 values per allow decision; a record array checks each row once.

Layout = Callable[[tuple[Any, ...]], tuple[Any, ...]] | None

#: Per open connection: each table's column names in PostgreSQL's order (its row type),
#: and for each ``(table name, keys)`` its record layout (:func:`_layout`).
_FIELDS: weakref.WeakKeyDictionary[asyncpg.Connection, dict[str, tuple[str, ...]]] = (
    weakref.WeakKeyDictionary())
_LAYOUTS: weakref.WeakKeyDictionary[
    asyncpg.Connection, dict[tuple[str, tuple[str, ...]], Layout]] = (
    weakref.WeakKeyDictionary())

_COLUMNS = ("SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum")


async def _fields(conn: asyncpg.Connection, table: Table) -> tuple[str, ...]:
    """``table``'s column names in its row type's order (read once per connection)."""
    known = _FIELDS.get(conn)
    if known is None:
        known = _FIELDS[conn] = {}
    found = known.get(table.name)
    if found is None:
        found = known[table.name] = tuple(
            row[0] for row in await conn.fetch(_COLUMNS, table.name))
    return found


async def _layout(conn: asyncpg.Connection, table: Table, keys: tuple[str, ...]) -> Layout:
    """What turns a row's values in ``keys`` order into a record of ``table``'s row type
    (``None``: they already are one). Cached per connection.

    Raises:
        ValueError: a key is not a column of the table in the database.
    """
    known = _LAYOUTS.get(conn)
    if known is None:
        known = _LAYOUTS[conn] = {}
    if (table.name, keys) in known:
        return known[(table.name, keys)]
    fields = await _fields(conn, table)
    unknown = set(keys) - set(fields)
    if unknown:
        raise ValueError(f"not columns of {table.name}: {sorted(unknown)}")
    layout: Layout = None
    if keys != fields:
        # Index len(keys) is the None each row gets appended for the fields it lacks (and
        # keeps the getter's answer a tuple, dropped after).
        at = {key: i for i, key in enumerate(keys)}
        pick = itemgetter(*(at.get(f, len(keys)) for f in fields), len(keys))

        def layout(values: tuple[Any, ...]) -> tuple[Any, ...]:
            return pick(values + (None,))[:-1]  # type: ignore[no-any-return]
    known[(table.name, keys)] = layout
    return layout


def _insert(table: Table, keys: tuple[str, ...], number: int,
            fields: tuple[str, ...]) -> str:
    """``INSERT INTO table (keys) SELECT keys FROM unnest($number::table[])``, refused
    (``division_by_zero``, a DataError: the batch is redone item by item through Core,
    and :meth:`PgLink.transaction` drops the cached layouts) unless the table's row type
    is still ``fields``, the layout the records were built for. A column dropped and
    added back, or two renamed, keeps the field count (and perhaps every field's type),
    so PostgreSQL would read the stale records and put a value in another column."""
    names = ", ".join(keys)
    return (f"INSERT INTO {table.name} ({names}) "
            f"SELECT {names} FROM unnest(${number}::{table.name}[]) "
            f"WHERE {_same_layout(table.name, fields)}")


@functools.lru_cache(maxsize=256)
def _same_layout(table: str, fields: tuple[str, ...]) -> str:
    """A condition true when ``table``'s row type is ``fields``, an error otherwise (an
    uncorrelated subquery: PostgreSQL evaluates it once per statement)."""
    expected = ", ".join("'" + field.replace("'", "''") + "'" for field in fields)
    return (f"(SELECT 1 / (array_agg(attname::text ORDER BY attnum) "
            f"= ARRAY[{expected}]::text[])::int FROM pg_attribute "
            f"WHERE attrelid = '{table}'::regclass AND attnum > 0 "
            f"AND NOT attisdropped) = 1")


async def _records(conn: asyncpg.Connection, dialect: Dialect, table: Table,
                   rows: Sequence[dict[str, Any]]
                   ) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """The rows' keys and the rows as records of ``table``'s row type, values encoded as
    the dialect's bind processors would (:mod:`cosigner.db.row_encoders`).

    Raises:
        ValueError: a key is not a column of the table in the database.
    """
    keys = tuple(rows[0])
    layout = await _layout(conn, table, keys)
    values = table_encoders(dialect, table, keys).rows(rows)
    return keys, values if layout is None else [layout(row) for row in values]


async def insert_tables(conn: asyncpg.Connection, dialect: Dialect,
                        groups: Sequence[tuple[Table, Sequence[dict[str, Any]]]]) -> None:
    """``INSERT`` every group's rows (each row with its group's first row's keys; groups
    in order, parents first) in one statement. Raises asyncpg's errors (mapped by
    :meth:`PgLink.transaction`)."""
    groups = [(table, rows) for table, rows in groups if rows]
    if not groups:
        return
    parts: list[str] = []
    args: list[Any] = []
    for table, rows in groups:
        keys, records = await _records(conn, dialect, table, rows)
        parts.append(_insert(table, keys, len(args) + 1, await _fields(conn, table)))
        args.append(records)
    if len(parts) == 1:
        sql = parts[0]
    else:
        ctes = ", ".join(f"w{i} AS ({part})" for i, part in enumerate(parts[:-1]))
        sql = f"WITH {ctes} {parts[-1]}"
    await conn.execute(sql, *args)


# -- the guard's reads (pdp.decision_log_writer's confirm), one statement ---------------
#
# Every lookup below is one probe of a unique (or the standing-rejection) index per key,
# written so that no other plan is possible: the keys come as parallel arrays
# (``unnest``), each probed by a LATERAL ``… >= key ORDER BY key LIMIT 1`` on the index's
# last column and kept when equal. asyncpg prepares each statement once per connection
# and PostgreSQL keeps its generic plan; planned while the tables are empty (a fresh
# database: every index costs the same then, a sequential scan less), a plain
# ``tenant = ANY(…) AND request_id = ANY(…)`` or ``EXISTS (… seq = …)`` kept a scan
# of the tenant's rows, or of the table, for the life of the connection (until an
# ANALYZE): 1,500 buffer reads per chain-head lock and 370 per guard read after 10,000
# decisions, most of PostgreSQL's CPU per decision. Only the index that delivers the
# ORDER BY needs no sort, so it wins on an empty table and on a full one.

_GUARD = (
    "SELECT 'd', k.t, d.request_id, d.id, d.run_id, d.request_hash, d.response, "
    "d.args_hash, d.policy_revision FROM unnest($1::varchar[], $2::varchar[]) AS k(t, r), "
    "LATERAL (SELECT request_id, id, request_hash, response, args_hash, policy_revision, "
    "run_id "
    "FROM decisions WHERE tenant = k.t AND request_id >= k.r ORDER BY request_id LIMIT 1"
    ") AS d WHERE d.request_id = k.r "
    "UNION ALL SELECT 'c', k.t, k.r, NULL, NULL, NULL, NULL, NULL, NULL "
    "FROM unnest($3::varchar[], $4::varchar[]) AS k(t, r), "
    "LATERAL (SELECT run_id FROM runs WHERE tenant = k.t AND run_id >= k.r "
    "ORDER BY run_id LIMIT 1) AS c WHERE c.run_id = k.r "
    "UNION ALL SELECT 'r', k.t, k.r, k.tool, k.h, NULL, NULL, NULL, NULL "
    "FROM unnest($5::varchar[], $6::varchar[], $7::varchar[], $8::varchar[]) "
    "AS k(t, r, tool, h), "
    "LATERAL (SELECT args_hash FROM approvals WHERE tenant = k.t AND run_id = k.r "
    "AND tool = k.tool AND args_hash >= k.h AND status = 'rejected' "
    "AND withdrawn_at IS NULL ORDER BY args_hash LIMIT 1) AS a WHERE a.args_hash = k.h")


class GuardReads(NamedTuple):
    """What :func:`guard_reads` found (the answers of ``pdp._decided``,
    ``contracts.contracted`` and ``rejections.rejected_calls``)."""

    #: ``{(tenant, request_id): (request_id, request_hash, response)}`` already decided.
    decided: dict[tuple[str, str], tuple[Any, ...]]
    #: The ``(tenant, run_id)`` pairs that have a run contract.
    contracted: set[tuple[str, str]]
    #: The ``(tenant, run_id, tool, args_hash)`` calls with a standing rejection.
    rejected: set[tuple[str, str, str, str]]


async def guard_reads(conn: asyncpg.Connection, dialect: Dialect,
                      requests: set[tuple[str, str]], pairs: set[tuple[str, str]],
                      calls: set[tuple[str, str, str, str]]) -> GuardReads:
    """The batch guard's three reads in one statement: one probe per key of the unique
    ``(tenant, request_id)`` key, ``runs``' key and the standing-rejection index (exact
    pairs and calls, so every row found answers one of them)."""
    load = decisions.c.response.type.dialect_impl(dialect).result_processor(dialect, None)
    request_hash = decisions.c.request_hash.type.dialect_impl(dialect).result_processor(
        dialect, None)
    keys, runs, rejections = sorted(requests), sorted(pairs), sorted(calls)
    rows = await conn.fetch(
        _GUARD, [t for t, _ in keys], [r for _, r in keys], [t for t, _ in runs],
        [r for _, r in runs], [c[0] for c in rejections], [c[1] for c in rejections],
        [c[2] for c in rejections], [c[3] for c in rejections])
    found = GuardReads({}, set(), set())
    for kind, a, b, c, d, digest, response, args_hash, revision in rows:
        if kind == "d":
            answer = load(response) if load else response
            if isinstance(answer, RowBound):  # form 3/7: c the decision id, d its run
                answer = response_row.unpack(answer.stored, (
                    c, b, request_hash(args_hash) if request_hash else args_hash,
                    None if revision is None
                    else request_hash(revision) if request_hash else revision, d))
            found.decided[(a, b)] = (
                b, request_hash(digest) if request_hash else digest, answer)
        elif kind == "c":
            found.contracted.add((a, b))
        else:
            found.rejected.add((a, b, c, d))
    return found


# -- the chain head (audit.chain.append_pg) ---------------------------------------------

#: The head and whether its event row is there: the first event at or after the head's
#: seq, on the ``(tenant, seq)`` key (see the guard's note on generic plans: ``EXISTS (…
#: seq = …)`` planned on an empty table searched ``(tenant, time)`` and filtered on seq).
_HEAD = ("SELECT h.seq, h.hash, COALESCE((SELECT e.seq FROM audit_events AS e "
         "WHERE e.tenant = h.tenant AND e.seq >= h.seq ORDER BY e.seq LIMIT 1) = h.seq, "
         "false) FROM audit_heads AS h WHERE h.tenant = $1 FOR UPDATE OF h")
_NEW_HEAD = ("INSERT INTO audit_heads (tenant, seq, hash) VALUES ($1, 0, $2) "
             "ON CONFLICT (tenant) DO NOTHING")


async def lock_head(conn: asyncpg.Connection, tenant: str, genesis: str
                    ) -> tuple[int, str, bool]:
    """``tenant``'s chain head ``(seq, hash, its event row is there)``, row-locked until
    the transaction ends (created at ``genesis`` the first time)."""
    row = await conn.fetchrow(_HEAD, tenant)
    if row is None:
        await conn.execute(_NEW_HEAD, tenant, genesis)
        row = await conn.fetchrow(_HEAD, tenant)
        assert row is not None
    return int(row[0]), str(row[1]), bool(row[2])


async def extend_chain(conn: asyncpg.Connection, dialect: Dialect, events: Table,
                       tenant: str, rows: Sequence[dict[str, Any]], seq: int,
                       digest: str) -> None:
    """Insert the event ``rows`` and move ``tenant``'s (locked) head to ``(seq, digest)``,
    in one statement."""
    move = "UPDATE audit_heads SET seq = $1, hash = $2 WHERE tenant = $3"
    if not rows:
        await conn.execute(move, seq, digest, tenant)
        return
    keys, records = await _records(conn, dialect, events, rows)
    sql = f"WITH e AS ({_insert(events, keys, 4, await _fields(conn, events))}) {move}"
    await conn.execute(sql, seq, digest, tenant, records)
