"""Run many use-case writes in one transaction (the batch runner for group commit).

Each item's ``work(conn)`` runs inside its own SAVEPOINT, so an item that fails (a unique
violation from a concurrent retry, a domain refusal) rolls back alone and gets its own
error, while the others commit. ``finish(conn, results)`` then runs once for the items
that succeeded (the decision log appends their events in one chain extension per tenant)
and the batch commits. Any failure outside an item's savepoint fails the whole batch,
which :class:`server.db.group_commit.GroupCommitter` turns into 503s for every waiter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from server.db.database import Database, UniqueViolation, _short
from server.errors import CosignerError

Work = Callable[[AsyncConnection], Awaitable[Any]]
Finish = Callable[[AsyncConnection, list[Any]], Awaitable[None]]


def savepoint_runner(db: Database, *, finish: Finish
                     ) -> Callable[[list[Work]], Awaitable[list[Any]]]:
    """A ``run_batch`` for :class:`GroupCommitter` whose items are ``work`` callables."""

    async def run_batch(items: list[Work]) -> list[Any]:
        outcomes: list[Any] = []
        async with db.transaction() as conn:
            succeeded: list[Any] = []
            for work in items:
                try:
                    async with conn.begin_nested():
                        result = await work(conn)
                except IntegrityError as exc:
                    outcomes.append(UniqueViolation(_short(exc)))
                    continue
                except CosignerError as exc:
                    outcomes.append(exc)
                    continue
                outcomes.append(result)
                succeeded.append(result)
            await finish(conn, succeeded)
        return outcomes

    return run_batch
