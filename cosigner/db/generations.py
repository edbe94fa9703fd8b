"""Change counters of state that replicas share (table ``replica_generations``).

A use case that changes shared state calls :func:`bump` in its own transaction, so the
new generation commits with the change; :func:`read_all` is the one query each replica
polls (:mod:`cosigner.db.replica_sync`).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.db.database import Database
from cosigner.db.polls import poll_rows
from cosigner.db.raw_sql import RawStatement
from cosigner.db.tables_keys import replica_generations

SIGNING_KEYS = "signing_keys"
CREDENTIALS = "credentials"

_READ_ALL = RawStatement(select(replica_generations.c.name,
                                replica_generations.c.generation))


async def bump(conn: AsyncConnection, name: str) -> None:
    """Add one to the generation ``name`` (rows are seeded by the migration)."""
    table = replica_generations
    await conn.execute(table.update().where(table.c.name == name)
                       .values(generation=table.c.generation + 1))


async def read_all(db: Database) -> dict[str, int]:
    """Every generation, by name: one statement (:func:`cosigner.db.polls.poll_rows`).

    Raises:
        Unavailable ``storage_unavailable``: the database cannot be read.
    """
    return {name: int(generation) for name, generation in await poll_rows(db, _READ_ALL)}
