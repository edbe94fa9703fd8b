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
            conn.execute("PRAGMA busy_timeout=0")
            try:
                return fn(*args, **kwargs)
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY:
                    raise
            finally:
                conn.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms}")
            return await super()._execute(fn, *args, **kwargs)  # type: ignore[no-untyped-call]
        return fn(*args, **kwargs)


def inline_creator(path: str, *, busy_timeout_ms: int) -> Callable[[], InlineConnection]:
    """An ``async_creator`` for ``create_async_engine``: connections to the SQLite file
    ``path``, usable from the loop thread and from their worker thread."""

    def create() -> InlineConnection:
        connector = partial(sqlite3.connect, path, timeout=busy_timeout_ms / 1000,
                            check_same_thread=False)
        return InlineConnection(connector, busy_timeout_ms=busy_timeout_ms)

    return create
