"""Alembic environment: runs migrations on the async engine given in the config."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil

from alembic import context
from sqlalchemy import pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

import cosigner.db
from cosigner.db.tables import metadata

# Import every tables_<area> module so autogenerate sees all tables.
for info in pkgutil.iter_modules(cosigner.db.__path__):
    if info.name.startswith("tables_"):
        importlib.import_module(f"cosigner.db.{info.name}")

config = context.config
target_metadata = metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    url = config.get_main_option("sqlalchemy.url")
    assert url is not None
    engine = create_async_engine(url, poolclass=pool.NullPool)
    async with engine.connect() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    asyncio.run(_run_async())
