"""Bulk inserts through the driver itself, for the group commit's hot statements.

SQLAlchemy Core costs 110–280 µs more per request than the same statements on the raw
driver (issue 20): an execution context, parameter processing and result set per
``execute``. :func:`insert_many` writes rows of one table with one ``executemany``
straight on the DB-API connection under the caller's :class:`AsyncConnection` — the same
connection and transaction, so atomicity, savepoints and lock order are untouched.

* SQLite (:mod:`cosigner.db.sqlite_inline`): the connection's ``sqlite3.Connection``,
  called on the event-loop thread like every inline statement (only ``COMMIT`` leaves
  the loop, unchanged).
* PostgreSQL and plain aiosqlite (``:memory:``): SQLAlchemy Core's executemany (on
  asyncpg, the adapter runs asyncpg's ``executemany`` under its mutex and transaction).
  The allow batch on PostgreSQL does not come here: it runs on asyncpg itself
  (:mod:`cosigner.db.raw_pg`).

Values are encoded as SQLAlchemy's bind processors would (the engine's dialect:
``DateTime`` text on SQLite, the engine's ``json_serializer`` for JSON columns), by
encoders compiled once per table (:mod:`cosigner.db.row_encoders`), so rows written
either way are identical. Driver errors are re-raised as SQLAlchemy's own
exceptions (``IntegrityError``, ``OperationalError``…, the driver error as ``orig``), so
:mod:`cosigner.db.batch` and :class:`cosigner.db.database.Database` map them as before
(unique key → redo item by item, outage → 503).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.db.row_encoders import table_encoders
from cosigner.db.sqlite_inline import InlineConnection

#: (table name, the rows' keys) → the INSERT statement
_SQL: dict[tuple[str, tuple[str, ...]], str] = {}


def insert_sql(table: Table, keys: tuple[str, ...]) -> str:
    """``INSERT INTO table (keys) VALUES (?, …)`` (a column not named keeps its default,
    as when SQLAlchemy inserts rows with the first row's keys)."""
    sql = _SQL.get((table.name, keys))
    if sql is None:
        sql = _SQL[(table.name, keys)] = (
            f"INSERT INTO {table.name} ({', '.join(keys)}) "
            f"VALUES ({', '.join('?' * len(keys))})")
    return sql


async def raw_sqlite(conn: AsyncConnection) -> sqlite3.Connection | None:
    """The ``sqlite3.Connection`` under ``conn`` when statements run inline on the loop
    thread (a file database), else ``None``."""
    if conn.dialect.name != "sqlite":
        return None
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    if not isinstance(driver, InlineConnection):
        return None
    return driver._connection  # noqa: SLF001 - the inline driver's own sqlite3 connection


def sqlite_rows(dialect: Dialect, table: Table, rows: Sequence[dict[str, Any]]
                ) -> tuple[str, list[tuple[Any, ...]]]:
    """``(INSERT SQL, parameter rows)`` for ``rows`` of ``table``, every row with the
    first row's keys (values encoded by :mod:`cosigner.db.row_encoders`)."""
    keys = tuple(rows[0])
    return insert_sql(table, keys), table_encoders(dialect, table, keys).rows(rows)


async def insert_many(conn: AsyncConnection, table: Table,
                      rows: Sequence[dict[str, Any]]) -> None:
    """Insert ``rows`` into ``table`` in ``conn``'s transaction (see the module docstring).

    Raises:
        sqlalchemy.exc.DBAPIError: its subclass for the driver's error (IntegrityError
            for a unique key, OperationalError for a locked or failing database).
    """
    if not rows:
        return
    first = rows[0].keys()
    if any(row.keys() != first for row in rows):
        await conn.execute(table.insert(), list(rows))
        return
    db = await raw_sqlite(conn)
    if db is None:
        await conn.execute(table.insert(), list(rows))
        return
    sqlite_many(db, *sqlite_rows(conn.dialect, table, rows))


def sqlite_many(db: sqlite3.Connection, sql: str, params: Iterable[Sequence[Any]]) -> None:
    """``executemany`` on the raw ``sqlite3`` connection, errors raised as SQLAlchemy's."""
    try:
        db.executemany(sql, params)
    except sqlite3.Error as exc:
        raise DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc


def sqlite_query(db: sqlite3.Connection, sql: str, params: Sequence[Any] = ()
                 ) -> list[Any]:
    """Run ``sql`` on the raw ``sqlite3`` connection of :func:`raw_sqlite` (inside the
    caller's transaction) and return its rows; driver errors raised as SQLAlchemy's (see
    :func:`insert_many`)."""
    try:
        return db.execute(sql, params).fetchall()
    except sqlite3.Error as exc:
        raise DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc
