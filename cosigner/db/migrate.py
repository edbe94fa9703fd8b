"""Apply Alembic migrations (``cosigner migrate`` and on ``serve``), once, under a lock.

Several replicas may start together and each run ``serve`` (which migrates first). The
upgrade therefore runs in one transaction that first takes a lock every other migrator
waits on:

* PostgreSQL: ``pg_advisory_xact_lock(MIGRATION_LOCK_KEY)``, released at commit;
* SQLite: the database's write lock (``BEGIN IMMEDIATE``), held until commit.

The second migrator gets the lock after the first committed, finds the database at head
and does nothing. ``serve --no-migrate`` only checks (:func:`pending_message`).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import event, pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

MIGRATIONS = Path(__file__).parent / "migrations"
#: Fixed key of the PostgreSQL advisory lock taken around an upgrade ("cosigner" in ASCII).
MIGRATION_LOCK_KEY = int.from_bytes(b"cosigner", "big") & 0x7FFF_FFFF_FFFF_FFFF
#: How long a migrator waits for another one's lock (SQLite busy timeout).
LOCK_WAIT_S = 600.0
#: Module names Alembic gives revision files (``0007_subjects.py`` → ``0007_subjects_py``).
_REVISION_MODULE = re.compile(r"\d{4}_\w+_py")


class MigrationStopped(RuntimeError):
    """A revision refused to run and changed nothing (``0007_subjects`` found subjects
    that name one person); the message says what the operator must resolve."""


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def script_heads() -> set[str]:
    """The head revisions of this version's migration scripts (one: history is linear)."""
    return set(ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads())


def _engine(url: str, *, lock_wait_s: float) -> AsyncEngine:
    if not url.startswith("sqlite"):
        return create_async_engine(url, poolclass=pool.NullPool)
    engine = create_async_engine(url, poolclass=pool.NullPool,
                                 connect_args={"timeout": lock_wait_s})

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock, before reading versions

    return engine


async def upgrade(url: str, *, lock_wait_s: float = LOCK_WAIT_S) -> None:
    """Upgrade the database at ``url`` to head under the migration lock (see the module
    docstring); creates a SQLite file's folder."""
    if url.startswith("sqlite") and ":///" in url:
        path = url.split(":///", 1)[1].split("?", 1)[0]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = _engine(url, lock_wait_s=lock_wait_s)
    try:
        async with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                                   {"key": MIGRATION_LOCK_KEY})
            await conn.run_sync(_upgrade_sync, url)
    except RuntimeError as exc:
        # A revision's own refusal (its exception class lives in the revision file,
        # which imports nothing from cosigner): the report, without a traceback.
        if _REVISION_MODULE.fullmatch(type(exc).__module__):
            raise MigrationStopped(str(exc)) from exc
        raise
    finally:
        await engine.dispose()


def _upgrade_sync(connection: Connection, url: str) -> None:
    cfg = alembic_config(url)
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, "heads")


def upgrade_blocking(url: str) -> None:
    asyncio.run(upgrade(url))


async def current_heads(url: str) -> set[str]:
    """The revisions recorded in the database's ``alembic_version`` (empty: never migrated;
    a missing SQLite file is not created)."""
    if url.startswith("sqlite") and ":///" in url:
        path = url.split(":///", 1)[1].split("?", 1)[0]
        if path and path != ":memory:" and not Path(path).exists():
            return set()
    engine = create_async_engine(url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(
                lambda sync: set(MigrationContext.configure(sync).get_current_heads()))
    finally:
        await engine.dispose()


async def pending_message(url: str) -> str | None:
    """``None`` when the database is at this version's head, else why it is not (for
    ``serve --no-migrate``, which then refuses to start)."""
    have, want = await current_heads(url), script_heads()
    if have == want:
        return None
    if not have:
        return "the database has no schema yet; run `cosigner migrate` first"
    known = {rev.revision for rev in
             ScriptDirectory.from_config(alembic_config(url)).walk_revisions()}
    unknown = sorted(have - known)
    if unknown:
        return (f"the database is at revision {', '.join(unknown)}, which this version of "
                "Cosigner does not know (made by a newer version?)")
    return (f"the database is at revision {', '.join(sorted(have))}, not at head "
            f"{', '.join(sorted(want))}; run `cosigner migrate` first")


def pending_message_blocking(url: str) -> str | None:
    return asyncio.run(pending_message(url))
