"""The PostgreSQL batch connection's transaction (cosigner.db.raw_pg.PgLink): a COMMIT
that PostgreSQL answers with ``ROLLBACK`` is never taken for a commit (DESIGN
invariant 2)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from cosigner.core.errors import Unavailable
from cosigner.db import raw_pg
from cosigner.db.database import Database


@pytest.fixture
async def pg_db(db_kind: str, database_url: str) -> AsyncIterator[Database]:
    if db_kind != "postgres":
        pytest.skip("the asyncpg batch connection is PostgreSQL's")
    db = Database(database_url)
    link = raw_pg.PgLink(db)
    conn = await link.connect()
    await conn.execute("CREATE TABLE IF NOT EXISTS link_w (x integer PRIMARY KEY)")
    await conn.execute("TRUNCATE link_w")
    yield db
    conn = await link.connect()
    await conn.execute("DROP TABLE link_w")
    await db.dispose()


async def test_an_aborted_transaction_whose_body_went_on_is_never_acknowledged(
        pg_db: Database) -> None:
    """A statement failed and its error was caught inside the body: PostgreSQL has
    aborted the transaction and answers the COMMIT with ``ROLLBACK`` (no error from
    asyncpg). The transaction must answer 503, not return as committed; the link serves
    the next batch."""
    link = raw_pg.PgLink(pg_db)
    with pytest.raises(Unavailable) as caught:
        async with link.transaction() as conn:
            await conn.execute("INSERT INTO link_w VALUES (1)")
            with pytest.raises(asyncpg.DivisionByZeroError):
                await conn.execute("SELECT 1 / 0")
    assert caught.value.code == "storage_unavailable"
    async with link.transaction() as conn:
        await conn.execute("INSERT INTO link_w VALUES (2)")
    conn = await link.connect()
    assert [r[0] for r in await conn.fetch("SELECT x FROM link_w ORDER BY x")] == [2]
