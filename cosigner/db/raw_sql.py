"""SQLAlchemy statements run on the raw ``sqlite3`` driver, for the redeem hot path.

A statement through SQLAlchemy Core costs an execution context, parameter and result
processing, a greenlet hop and a pool check-out around it (bench/README.md, "Redeem and
approval on the raw driver"). :class:`RawStatement` compiles a Core statement once per
dialect (the SQL text SQLAlchemy itself would send, with its positional binds, bind
processors and result processors) and runs it straight on a ``sqlite3.Connection``:

* inside a transaction, on the committer's own connection (:func:`raw_sqlite` of
  :mod:`cosigner.db.raw_insert`): same connection and transaction, so atomicity,
  savepoints and lock order are untouched;
* outside one, for a read: :func:`read_connection`, one ``sqlite3`` connection per
  :class:`~cosigner.db.database.Database` (file databases only) used on the event-loop
  thread with no ``await`` while it is in use, so one connection serves every reader
  (WAL readers never wait for writers). ``BEGIN`` … ``ROLLBACK`` around several
  statements gives them one snapshot.

Values go through the same bind and result processors SQLAlchemy applies (``DateTime``
text, JSON and compressed JSON columns), so rows read either way are identical. Driver
errors are re-raised as SQLAlchemy's own (``IntegrityError``, ``OperationalError``… with
the driver error as ``orig``), so the batch and :class:`Database` map them as before.
Other databases (PostgreSQL, ``:memory:``) keep SQLAlchemy: callers get ``None`` from
:func:`read_connection` / :func:`raw_sqlite` and take their Core path.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Literal, cast

from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from cosigner.core.errors import Unavailable

_Processor = Callable[[Any], Any] | None


class RawStatement:
    """One Core statement, compiled once per dialect for :meth:`run` on ``sqlite3``."""

    __slots__ = ("_plans", "statement")

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._plans: dict[int, tuple[str, tuple[tuple[str, Any, _Processor], ...],
                                     tuple[_Processor, ...]]] = {}

    def _plan(self, dialect: Dialect) -> tuple[str, tuple[tuple[str, Any, _Processor], ...],
                                               tuple[_Processor, ...]]:
        plan = self._plans.get(id(dialect))
        if plan is None:
            # A Core statement compiles with the dialect's SQLCompiler (binds, result map).
            compiled = cast(SQLCompiler, self.statement.compile(dialect=dialect))
            binds = []
            for name in compiled.positiontup or ():
                bind = compiled.binds[name]
                binds.append((name, bind.value if not bind.required else None,
                              bind.type._cached_bind_processor(dialect)))  # noqa: SLF001
            results = tuple(column[3]._cached_result_processor(dialect, None)  # noqa: SLF001
                            for column in compiled._result_columns)  # noqa: SLF001
            plan = self._plans[id(dialect)] = (str(compiled), tuple(binds), results)
        return plan

    def run(self, db: sqlite3.Connection, dialect: Dialect,
            values: Mapping[str, Any]) -> tuple[list[tuple[Any, ...]], int]:
        """``(rows with result processors applied, rowcount)``.

        Raises:
            sqlalchemy.exc.DBAPIError: its subclass for the driver's error.
        """
        sql, binds, results = self._plan(dialect)
        params = []
        for name, default, proc in binds:
            value = values.get(name, default)
            params.append(proc(value) if proc is not None else value)
        try:
            cursor = db.execute(sql, params)
            fetched = cursor.fetchall()
        except sqlite3.Error as exc:
            raise DBAPIError.instance(sql, params, exc, sqlite3.Error) from exc
        if not fetched:
            return [], cursor.rowcount
        if any(proc is not None for proc in results):
            fetched = [tuple(value if proc is None else proc(value)
                             for proc, value in zip(results, row, strict=True))
                       for row in fetched]
        return fetched, cursor.rowcount


class _Reader:
    """The per-Database read connection (see the module docstring)."""

    def __init__(self, path: str, busy_timeout_ms: int) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.conn: sqlite3.Connection | None = None
        self.thread = threading.get_ident()
        self.busy = False

    def connect(self) -> sqlite3.Connection:
        if self.conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None,
                                   check_same_thread=False,
                                   timeout=self.busy_timeout_ms / 1000)
            conn.execute("PRAGMA foreign_keys=ON")
            self.conn = conn
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _reader(database: Any) -> _Reader | None:
    reader: _Reader | None | Literal[False] = database.__dict__.get("_raw_reader", False)
    if reader is False:
        reader = None
        url = make_url(database.url)
        path = url.database or ""
        if (database.is_sqlite and path and path != ":memory:"
                and not path.startswith("file:")):
            reader = _Reader(path, int(database._busy_timeout_ms))  # noqa: SLF001
        database.__dict__["_raw_reader"] = reader
    return reader


class ReadConnection:
    """A ``sqlite3`` connection holding one read snapshot (``BEGIN`` … ``ROLLBACK``), for
    statements run with no ``await`` in between; ``with`` gives ``None`` when ``database``
    is not a SQLite file (use SQLAlchemy then) or the connection is in use (re-entrance).
    ``snapshot=False``: no ``BEGIN`` (for one statement, which is its own snapshot in
    autocommit mode).

    A class rather than a ``@contextmanager``: the generator's enter and exit cost about
    2 % of a redeem (bench/README.md, session 10); tests/db/test_raw_transaction_class.py
    drives both forms through the same faults.

    Raises:
        Unavailable ``storage_unavailable``: the database cannot be read.
    """

    __slots__ = ("_database", "_snapshot", "_reader", "_conn")

    def __init__(self, database: Any, *, snapshot: bool = True) -> None:
        self._database = database
        self._snapshot = snapshot
        self._reader: _Reader | None = None

    def __enter__(self) -> sqlite3.Connection | None:
        reader = _reader(self._database)
        if reader is None or reader.busy or reader.thread != threading.get_ident():
            return None
        reader.busy = True
        try:
            conn = reader.connect()
            if self._snapshot:
                conn.execute("BEGIN")
        except sqlite3.Error as exc:
            reader.close()
            reader.busy = False
            raise Unavailable("the database is unavailable",
                              code="storage_unavailable") from exc
        except BaseException:
            reader.busy = False
            raise
        self._reader, self._conn = reader, conn
        return conn

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        reader = self._reader
        if reader is None:
            return
        self._reader = None
        try:
            try:
                if isinstance(exc, DBAPIError):
                    raise Unavailable("the database is unavailable",
                                      code="storage_unavailable") from exc
            finally:
                conn = self._conn
                try:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                except sqlite3.Error:
                    reader.close()
        finally:
            reader.busy = False


#: The name the redeem, approval and poll reads use.
read_connection = ReadConnection


def has_raw_reader(database: Any) -> bool:
    """Whether :func:`read_connection` can read ``database`` on the raw driver (a SQLite
    file; not PostgreSQL or an in-memory SQLite). It may still give ``None`` when its
    connection is in use or on another thread."""
    return _reader(database) is not None


def close_reader(database: Any) -> None:
    """Close ``database``'s read connection, if one was opened (on dispose)."""
    reader = database.__dict__.get("_raw_reader")
    if reader:
        reader.close()
    database.__dict__.pop("_raw_reader", None)
