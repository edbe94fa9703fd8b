"""Migrations: one head, run once under a lock, ``serve --no-migrate`` refuses a database
that is not at head."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from cosigner.db.migrate import (
    MIGRATION_LOCK_KEY,
    alembic_config,
    current_heads,
    script_heads,
    upgrade,
)
from tests.conftest import PG_BASE_URL, ROOT, _pg_admin, free_port


def test_history_has_exactly_one_head() -> None:
    heads = ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()
    assert len(heads) == 1


@pytest.fixture
def empty_database(db_kind: str, tmp_path: Path) -> Iterator[str]:
    if db_kind == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
        return
    name = f"cosigner_migrate_{os.getpid()}"
    _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _pg_admin(f'CREATE DATABASE "{name}"')
    yield PG_BASE_URL.rsplit("/", 1)[0] + "/" + name
    _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_upgrade_waits_for_the_migration_lock(empty_database: str) -> None:
    """Another holder of the lock (advisory lock / SQLite write lock) keeps the upgrade
    waiting; once released, the upgrade runs."""
    url = empty_database
    if url.startswith("sqlite"):
        Path(url.split(":///", 1)[1]).touch()
    holder = create_async_engine(url)
    try:
        async with holder.connect() as conn:
            if conn.dialect.name == "postgresql":
                await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            else:
                await conn.exec_driver_sql("BEGIN IMMEDIATE")
            task = asyncio.create_task(upgrade(url))
            await asyncio.sleep(1.5)
            assert not task.done()
            if conn.dialect.name == "postgresql":
                await conn.execute(text("SELECT pg_advisory_unlock(:k)"),
                                   {"k": MIGRATION_LOCK_KEY})
            else:
                await conn.exec_driver_sql("ROLLBACK")
            await asyncio.wait_for(task, timeout=60)
    finally:
        await holder.dispose()
    assert await current_heads(url) == script_heads()


def _env(url: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSIGNER_")}
    env.update({"COSIGNER_DATABASE_URL": url, "COSIGNER_KEY_DIR": str(tmp_path / "keys")})
    return env


def test_replicas_migrating_together_migrate_once(empty_database: str, tmp_path: Path) -> None:
    """Three ``cosigner migrate`` started together on an empty database all succeed and
    leave one version row at head."""
    env = _env(empty_database, tmp_path)
    procs = [subprocess.Popen([sys.executable, "-m", "cosigner", "migrate"], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert asyncio.run(current_heads(empty_database)) == script_heads()


def test_serve_no_migrate_refuses_a_database_without_schema(empty_database: str,
                                                             tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cosigner", "serve", "--no-migrate", "--port", str(free_port())],
        cwd=ROOT, env=_env(empty_database, tmp_path), capture_output=True, text=True,
        timeout=60)
    assert done.returncode == 1
    assert "no schema yet; run `cosigner migrate` first" in done.stderr
    if empty_database.startswith("sqlite"):  # the check does not create the file
        assert not Path(empty_database.split(":///", 1)[1]).exists()
