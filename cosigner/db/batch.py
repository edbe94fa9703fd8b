"""Run many use-case writes in one transaction (the batch runner for group commit).

An item is either

* a :class:`Write` already prepared in memory (the hot path: an ``allow`` or ``deny``
  with nothing to read under the lock): its rows are inserted together with every other
  prepared item's rows, one ``executemany`` per table on the raw driver
  (:mod:`cosigner.db.raw_insert`); or
* a callable ``work(conn) -> Write`` that must read or update state under the write lock
  (run contracts, approval requests, redeem's single-use UPDATE); a :class:`RawWork`
  also carries the same work on SQLite's own driver, so a batch of prepared writes and
  raw work items never touches SQLAlchemy on a SQLite file.

A batch first runs optimistically: prepared rows in bulk, work items one after another
with no SAVEPOINT each. If any item fails (a refusal it raises, a unique key, a value the
database refuses) the whole transaction is rolled back and the batch redone item by
item, each work item in its own SAVEPOINT, so only the failing item fails. Items must
therefore be safe to run twice (nothing of a rolled-back attempt remains).

A ``guard(conn, writes)`` may refuse prepared items first, inside the batch's transaction
(decisions use it to confirm that the run they assumed had no contract still has none).
``finish(conn, writes)`` then runs once for the items that succeeded (the decision log
chains their events, one extension per tenant) and the batch commits. A batch that
PostgreSQL aborts to break a deadlock with another replica is run again (items must be
safe to re-run: nothing of the aborted attempt was committed). Any other failure fails
the batch, and :class:`cosigner.db.group_commit.GroupCommitter` answers 503
to every waiter in it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.core.errors import CosignerError, Unavailable
from cosigner.db import raw_pg
from cosigner.db.database import (
    RETRYABLE_SQLSTATES,
    Database,
    TransientConflict,
    UniqueViolation,
    _short,
)
from cosigner.db.raw_insert import insert_many, sqlite_many, sqlite_rows
from cosigner.db.raw_transaction import raw_transaction

if TYPE_CHECKING:
    import asyncpg

log = logging.getLogger("cosigner.db.batch")

#: How often a batch aborted by a deadlock or serialization failure is run in all.
TRANSIENT_ATTEMPTS = 6


@dataclass(frozen=True, slots=True)
class Write:
    """One use case's write: rows to insert, log ``events`` for ``finish``, and the
    ``result`` its waiter receives once the batch committed. ``assumes``: what the
    batch's ``guard`` must confirm before the rows go in (opaque here)."""

    tenant: str
    events: list[Any]
    result: Any
    rows: list[tuple[Table, dict[str, Any]]] = field(default_factory=list)
    assumes: Any = None


Work = Callable[[AsyncConnection], Awaitable[Write]]


class NeedsCore(Exception):
    """Raised by a :class:`RawWork`'s ``raw`` when the case is not one it handles on the
    driver (rare states: a revoke, a contract to count, a due approval twin to expire): the raw
    transaction is rolled back and the batch runs again on the SQLAlchemy path."""


@dataclass(frozen=True, slots=True)
class RawWork:
    """A work item with a twin on SQLite's own driver: ``core(conn)`` is the
    :data:`Work` (any database; what a redo item by item runs), ``raw(conn, dialect)``
    the same reads and writes on the ``sqlite3`` connection of a raw batch transaction
    (:func:`cosigner.db.raw_transaction.raw_transaction`), synchronous. ``raw`` may raise
    :class:`NeedsCore` (run the batch the SQLAlchemy way) or a :class:`CosignerError`
    (redo the batch item by item, as for any work item)."""

    core: Work
    raw: Callable[[sqlite3.Connection, Dialect], Write]

    def __call__(self, conn: AsyncConnection) -> Awaitable[Write]:
        return self.core(conn)


class _RedoItemByItem(Exception):
    """A work item refused in an optimistic (savepoint-free) batch: redo item by item."""


Item = Write | Work | RawWork
Finish = Callable[[AsyncConnection, list[Write]], Awaitable[None]]
#: ``guard(conn, writes)`` → the indexes (into ``writes``) refused, with their errors.
Guard = Callable[[AsyncConnection, list[Write]], Awaitable[dict[int, CosignerError]]]


@dataclass(frozen=True, slots=True)
class RawHooks:
    """``guard`` and ``finish`` on a SQLite write transaction's own ``sqlite3``
    connection (same reads and writes as their SQLAlchemy twins), for batches of prepared
    :class:`Write` s only: such a batch then never touches SQLAlchemy
    (:func:`cosigner.db.raw_transaction.raw_transaction`)."""

    guard: Callable[[sqlite3.Connection, Dialect, list[Write]], dict[int, CosignerError]]
    finish: Callable[[sqlite3.Connection, Dialect, list[Write]], None]


@dataclass(frozen=True, slots=True)
class PgHooks:
    """``guard`` and ``finish`` on a PostgreSQL batch's own asyncpg connection (same reads
    and writes as their SQLAlchemy twins), for batches of prepared :class:`Write` s only
    (:mod:`cosigner.db.raw_pg`)."""

    guard: Callable[[asyncpg.Connection, Dialect, list[Write]],
                    Awaitable[dict[int, CosignerError]]]
    finish: Callable[[asyncpg.Connection, Dialect, list[Write]], Awaitable[None]]


def savepoint_runner(db: Database, *, finish: Finish, guard: Guard | None = None,
                     raw: RawHooks | None = None, pg: PgHooks | None = None
                     ) -> Callable[[list[Item]], Awaitable[list[Any]]]:
    """A ``run_batch`` for :class:`GroupCommitter` over :data:`Item` s. With ``raw``
    hooks, a batch of prepared writes and :class:`RawWork` s only, on a file SQLite
    database, runs on the driver; with ``pg`` hooks, a batch of prepared writes only on
    PostgreSQL runs through asyncpg, on the runner's own connection (the optimistic bulk
    attempt; a redo item by item takes the SQLAlchemy path, and so does a SQLite batch
    when a ``raw`` raises :class:`NeedsCore`)."""
    link = raw_pg.PgLink(db) if pg is not None and not db.is_sqlite else None

    async def run_batch(items: list[Item]) -> list[Any]:
        bulk, aborted = True, 0
        while True:
            try:
                if bulk and raw is not None and db.is_sqlite and all(
                        type(item) is Write or type(item) is RawWork for item in items):
                    try:
                        outcomes = await _run_raw(items)  # type: ignore[arg-type]
                    except NeedsCore:
                        outcomes = None  # rolled back: the SQLAlchemy path decides
                    if outcomes is not None:
                        return outcomes
                if bulk and link is not None and link.enabled and all(
                        type(item) is Write for item in items):
                    return await _run_pg(items)  # type: ignore[arg-type]
                return await _run(items, bulk=bulk)
            except (UniqueViolation, _RedoItemByItem):
                if not bulk:
                    raise
                bulk = False
            except TransientConflict:
                # PostgreSQL broke a lock cycle with another replica's transaction (e.g.
                # two batches opening the same approvals in different orders): all of it
                # rolled back, so run it again.
                aborted += 1
                if aborted >= TRANSIENT_ATTEMPTS:
                    raise
                # Jittered back-off, so the two batches do not meet in the same cycle again.
                await asyncio.sleep(random.uniform(0, 0.02 * aborted))
            except Unavailable as exc:
                # A bulk insert the database refused (one item's value): redo item by
                # item so only the culprit fails. An outage (lock wait expired, I/O,
                # connection lost) is answered 503 at once rather than waited out twice.
                if not bulk or _is_outage(exc):
                    raise
                bulk = False

    async def _run(items: list[Item], *, bulk: bool) -> list[Any]:
        outcomes: list[Any] = []
        done: list[Write] = []
        async with db.transaction() as conn:
            refused: dict[int, CosignerError] = {}
            if guard is not None:
                prepared = [(i, item) for i, item in enumerate(items)
                            if isinstance(item, Write)]
                verdicts = await guard(conn, [item for _, item in prepared])
                refused = {prepared[k][0]: exc for k, exc in verdicts.items()}
            inserted: list[Write] = []
            for index, item in enumerate(items):
                if index in refused:
                    outcomes.append(refused[index])
                    continue
                if bulk:
                    # Optimistic: no savepoint per item. Any refusal or database error
                    # rolls the whole batch back, and it is redone item by item.
                    try:
                        write = item if isinstance(item, Write) else await item(conn)
                    except CosignerError as exc:
                        raise _RedoItemByItem from exc
                    outcomes.append(write)
                    done.append(write)
                    inserted.append(write)  # its rows go in with the bulk insert
                    continue
                try:
                    async with conn.begin_nested():
                        write = item if isinstance(item, Write) else await item(conn)
                        for table, values in write.rows:
                            await conn.execute(table.insert(), values)
                except IntegrityError as exc:
                    outcomes.append(UniqueViolation.from_db(exc))
                    continue
                except DBAPIError as exc:
                    if exc.connection_invalidated or getattr(
                            exc.orig, "sqlstate", None) in RETRYABLE_SQLSTATES:
                        raise  # an outage, or a lock cycle: the whole batch is redone
                    log.error("write refused by the database: %s", _short(exc))
                    outcomes.append(Unavailable("the write was refused by the database",
                                                code="storage_unavailable"))
                    continue
                except CosignerError as exc:
                    outcomes.append(exc)
                    continue
                outcomes.append(write)
                done.append(write)
            if bulk:
                await _insert_prepared(conn, inserted)
            await finish(conn, done)
        return outcomes

    async def _run_raw(items: list[Write | RawWork]) -> list[Any] | None:
        """The bulk attempt of a batch of prepared writes and raw work items on SQLite's
        own driver (as :func:`_run` with ``bulk``: guard, items in order, bulk insert,
        finish), or ``None`` when the database is not a file (no inline driver)."""
        assert raw is not None
        async with raw_transaction(db) as conn:
            if conn is None:
                return None
            dialect = db.engine.dialect
            refused: dict[int, CosignerError] = {}
            if guard is not None:
                prepared = [(i, item) for i, item in enumerate(items)
                            if type(item) is Write]
                verdicts = raw.guard(conn, dialect, [item for _, item in prepared])
                refused = {prepared[k][0]: exc for k, exc in verdicts.items()}
            outcomes: list[Any] = []
            done: list[Write] = []
            for index, item in enumerate(items):
                if index in refused:
                    outcomes.append(refused[index])
                    continue
                if type(item) is RawWork:
                    try:
                        item = item.raw(conn, dialect)
                    except CosignerError as exc:
                        raise _RedoItemByItem from exc
                outcomes.append(item)
                done.append(item)  # type: ignore[arg-type]
            for table, rows in _by_table(done).items():  # parents before children
                for same in _same_keys(rows):
                    sqlite_many(conn, *sqlite_rows(dialect, table, same))
            raw.finish(conn, dialect, done)
        return outcomes

    async def _run_pg(items: list[Write]) -> list[Any]:
        """The bulk attempt of an all-prepared batch on PostgreSQL's asyncpg connection:
        the guard's reads, the rows, then the chain heads (locked last, in tenant order,
        so they are held for the events, the head update and the COMMIT only)."""
        assert pg is not None and link is not None
        dialect = db.engine.dialect
        async with link.transaction() as conn:
            refused = await pg.guard(conn, dialect, items) if guard is not None else {}
            outcomes, done = _split(items, refused)
            await raw_pg.insert_tables(conn, dialect, [  # one statement, parents first
                (table, same) for table, rows in _by_table(done).items()
                for same in _same_keys(rows)])
            await pg.finish(conn, dialect, done)
        return outcomes

    return run_batch


def _split(items: list[Write], refused: dict[int, CosignerError]
           ) -> tuple[list[Any], list[Write]]:
    """``(outcomes, writes to insert)``: the guard's refusals in place, the rest as is."""
    outcomes: list[Any] = []
    done: list[Write] = []
    for index, item in enumerate(items):
        if index in refused:
            outcomes.append(refused[index])
        else:
            outcomes.append(item)
            done.append(item)
    return outcomes, done


def _by_table(writes: list[Write]) -> dict[Table, list[dict[str, Any]]]:
    by_table: dict[Table, list[dict[str, Any]]] = {}
    for write in writes:
        for table, values in write.rows:
            by_table.setdefault(table, []).append(values)
    return by_table


def _same_keys(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``rows`` grouped by their keys, in order of first appearance (one INSERT each)."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row), []).append(row)
    return list(groups.values())


async def _insert_prepared(conn: AsyncConnection, writes: list[Write]) -> None:
    for table, rows in _by_table(writes).items():  # insertion order: parents before children
        await insert_many(conn, table, rows)  # the raw driver's executemany


def _is_outage(exc: BaseException) -> bool:
    """True when the database, not one value, failed (OperationalError, lost connection)."""
    cause = exc.__cause__
    return not isinstance(cause, DBAPIError) or isinstance(cause, OperationalError) or bool(
        cause.connection_invalidated)
