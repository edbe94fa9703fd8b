"""Apply Alembic migrations (``cosigner migrate`` and on ``serve``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import create_async_engine

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


async def upgrade(url: str) -> None:
    """Upgrade the database at ``url`` to every head; creates a SQLite file's folder."""
    if url.startswith("sqlite") and ":///" in url:
        path = url.split(":///", 1)[1].split("?", 1)[0]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_upgrade_sync, url)
    finally:
        await engine.dispose()


def _upgrade_sync(connection: object, url: str) -> None:
    cfg = alembic_config(url)
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, "heads")


def upgrade_blocking(url: str) -> None:
    asyncio.run(upgrade(url))
