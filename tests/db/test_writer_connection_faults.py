"""Faults at the worst moment on the kept SQLite write connection (s9 break review): a
COMMIT that fails, and another process killed (-9) between its BEGIN IMMEDIATE and its
COMMIT while holding the write lock. Nothing of a failed transaction is kept or
acknowledged, and the next batch works."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cosigner.core.errors import Unavailable
from cosigner.db.database import Database, UniqueViolation
from cosigner.db.raw_transaction import raw_transaction
from tests.conftest import migrated_database


@pytest.fixture
async def file_db(tmp_path: Path, sqlite_template: Path) -> AsyncIterator[Database]:
    db = Database(migrated_database(tmp_path, "sqlite", None, sqlite_template),
                  busy_timeout_ms=2000)
    async with db.transaction() as conn:
        await conn.exec_driver_sql("CREATE TABLE w (x INTEGER PRIMARY KEY)")
        # Checked at COMMIT only: a COMMIT that fails while the statements all ran.
        await conn.exec_driver_sql(
            "CREATE TABLE c (p INTEGER REFERENCES w(x) DEFERRABLE INITIALLY DEFERRED)")
    yield db
    await db.dispose()


def _path(db: Database) -> str:
    return db.url.split("///", 1)[1]


def _rows(db: Database, table: str = "w") -> list[int]:
    conn = sqlite3.connect(_path(db), isolation_level=None, timeout=0)
    try:
        return [x for (x,) in conn.execute(f"SELECT * FROM {table} ORDER BY 1")]  # noqa: S608
    finally:
        conn.close()


async def _batch(db: Database, *statements: str) -> None:
    async with raw_transaction(db) as conn:
        assert conn is not None
        for statement in statements:
            conn.execute(statement)


async def test_a_failed_commit_keeps_nothing_and_the_next_batch_works(
        file_db: Database) -> None:
    with pytest.raises((UniqueViolation, Unavailable)):  # never an acknowledgement
        await _batch(file_db, "INSERT INTO w VALUES (1)", "INSERT INTO c VALUES (999)")
    assert _rows(file_db) == [] and _rows(file_db, "c") == []
    writer = file_db.sqlite_write_connection
    assert writer is not None
    driver = await writer.connection()
    assert driver._connection is not None and not driver._connection.in_transaction
    await _batch(file_db, "INSERT INTO w VALUES (2)")
    assert _rows(file_db) == [2]
    # The kept connection still never waits between calls (WAL) after the failure.
    assert driver._connection.execute("PRAGMA busy_timeout").fetchone()[0] == 0


_HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=0)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO w VALUES (666)")
print("held", flush=True)
time.sleep(60)
"""


async def test_a_writer_killed_between_begin_and_commit_leaves_nothing(
        file_db: Database) -> None:
    await _batch(file_db, "INSERT INTO w VALUES (1)")  # the kept connection is open
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, _path(file_db)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        waiting = asyncio.create_task(_batch(file_db, "INSERT INTO w VALUES (2)"))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # waits for the other process's write lock
        os.kill(holder.pid, signal.SIGKILL)  # dies between its BEGIN and its COMMIT
        holder.wait(10)
        await asyncio.wait_for(waiting, 10)  # the lock died with it: our batch commits
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
    assert _rows(file_db) == [1, 2]  # nothing of the killed transaction
    await _batch(file_db, "INSERT INTO w VALUES (3)")
    assert _rows(file_db) == [1, 2, 3]
