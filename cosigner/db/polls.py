"""One cheap read for the background polls (replica sync, policy follower, checkpointer,
approval sweep), which run every second or so on every replica whatever the load.

Through SQLAlchemy (pool check-out, execution context, result processing, a greenlet hop
each way) one such read cost more CPU than the statement itself; on a SQLite file it runs
on the database's raw read connection instead (:func:`cosigner.db.raw_sql.read_connection`,
the loop thread, no ``await``), elsewhere (PostgreSQL, ``:memory:``) through Core. Either
way it is one statement, which is its own snapshot, and it reads the database: what
another process committed is seen by the next poll.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from sqlalchemy.sql.base import Executable

from cosigner.db.database import Database
from cosigner.db.raw_sql import RawStatement, read_connection


async def poll_rows(db: Database, statement: RawStatement,
                    values: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """The rows of ``statement`` (a Core ``SELECT`` compiled for the raw driver) with
    bind ``values``, as tuples in column order with SQLAlchemy's result processing.

    Raises:
        Unavailable ``storage_unavailable``: the database cannot be read.
    """
    values = values or {}
    with read_connection(db, snapshot=False) as conn:
        if conn is not None:
            return statement.run(conn, db.engine.dialect, values)[0]
    async with db.read() as conn:
        query = cast(Executable, statement.statement)  # a SELECT (the docstring's contract)
        return [tuple(row) for row in (await conn.execute(query, values))]
