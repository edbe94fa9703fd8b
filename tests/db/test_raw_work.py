"""RawWork items in a group-commit batch (cosigner.db.batch): on a SQLite file the batch
runs them on the driver; ``NeedsCore`` sends the whole batch the SQLAlchemy way with
nothing of the raw attempt kept; a refusal redoes the batch item by item so only that
item fails; PostgreSQL always takes the SQLAlchemy way."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.core.errors import CosignerError, PermitRefused
from cosigner.db.batch import NeedsCore, RawHooks, RawWork, Write, savepoint_runner
from cosigner.db.database import Database
from cosigner.db.raw_sql import RawStatement
from cosigner.db.tables import permits

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def _row(tenant: str, jti: str) -> dict[str, Any]:
    return {"jti": jti, "tenant": tenant, "decision_id": f"d-{jti}", "approval_id": None,
            "run_id": "r", "tool": "t", "args_hash": "h", "status": "issued",
            "issued_at": NOW, "expires_at": NOW, "redeemed_at": None, "revoked_at": None}


_INSERT = RawStatement(permits.insert())


class _Item:
    """A work item inserting one permit row, either way; counts which way ran."""

    def __init__(self, tenant: str, jti: str, *, raw_error: BaseException | None = None,
                 refuse: bool = False) -> None:
        self.tenant, self.jti = tenant, jti
        self.raw_error, self.refuse = raw_error, refuse
        self.ran: list[str] = []

    async def core(self, conn: AsyncConnection) -> Write:
        self.ran.append("core")
        if self.refuse:
            raise PermitRefused("no", code="already_redeemed")
        await conn.execute(permits.insert(), _row(self.tenant, self.jti))
        return Write(self.tenant, [], self.jti)

    def raw(self, conn: sqlite3.Connection, dialect: Dialect) -> Write:
        self.ran.append("raw")
        _INSERT.run(conn, dialect, _row(self.tenant, self.jti))  # undone if it raises
        if self.raw_error is not None:
            raise self.raw_error
        if self.refuse:
            raise PermitRefused("no", code="already_redeemed")
        return Write(self.tenant, [], self.jti)

    def item(self) -> RawWork:
        return RawWork(self.core, self.raw)


def _runner(db: Database, finished: list[list[Any]]) -> Any:
    async def finish(conn: AsyncConnection, writes: list[Write]) -> None:
        finished.append(["core", *(w.result for w in writes)])

    def finish_raw(conn: sqlite3.Connection, dialect: Dialect, writes: list[Write]) -> None:
        finished.append(["raw", *(w.result for w in writes)])

    async def guard(conn: AsyncConnection, writes: list[Write]) -> dict[int, CosignerError]:
        return {}

    return savepoint_runner(db, finish=finish, guard=guard,
                            raw=RawHooks(lambda conn, dialect, writes: {}, finish_raw))


async def _jtis(db: Database, tenant: str) -> list[str]:
    async with db.read() as conn:
        rows = await conn.execute(select(permits.c.jti).where(permits.c.tenant == tenant)
                                  .order_by(permits.c.jti))
        return [row.jti for row in rows]


async def test_raw_work_runs_on_the_driver_with_prepared_writes(database_url: str,
                                                                 tenant: str) -> None:
    db = Database(database_url)
    try:
        finished: list[list[Any]] = []
        first, second = _Item(tenant, f"{tenant}-1"), _Item(tenant, f"{tenant}-2")
        prepared = Write(tenant, [], "prepared", [(permits, _row(tenant, f"{tenant}-0"))])
        outcomes = await _runner(db, finished)([first.item(), prepared, second.item()])
        assert [o.result for o in outcomes] == [f"{tenant}-1", "prepared", f"{tenant}-2"]
        way = "raw" if db.is_sqlite else "core"
        assert first.ran == second.ran == [way]
        assert finished == [[way, f"{tenant}-1", "prepared", f"{tenant}-2"]]
        assert await _jtis(db, tenant) == [f"{tenant}-0", f"{tenant}-1", f"{tenant}-2"]
    finally:
        await db.dispose()


async def test_needs_core_runs_the_batch_the_sqlalchemy_way(database_url: str,
                                                             tenant: str) -> None:
    db = Database(database_url)
    try:
        finished: list[list[Any]] = []
        plain, odd = _Item(tenant, f"{tenant}-1"), _Item(tenant, f"{tenant}-2",
                                                          raw_error=NeedsCore())
        outcomes = await _runner(db, finished)([plain.item(), odd.item()])
        assert [o.result for o in outcomes] == [f"{tenant}-1", f"{tenant}-2"]
        if db.is_sqlite:
            assert plain.ran == ["raw", "core"] and odd.ran == ["raw", "core"]
        assert finished == [["core", f"{tenant}-1", f"{tenant}-2"]]
        # The raw attempt's inserts were rolled back: each row once, no unique violation.
        assert await _jtis(db, tenant) == [f"{tenant}-1", f"{tenant}-2"]
    finally:
        await db.dispose()


async def test_a_refused_raw_item_fails_alone(database_url: str, tenant: str) -> None:
    db = Database(database_url)
    try:
        finished: list[list[Any]] = []
        plain, refused = _Item(tenant, f"{tenant}-1"), _Item(tenant, f"{tenant}-2",
                                                             refuse=True)
        outcomes = await _runner(db, finished)([plain.item(), refused.item()])
        assert outcomes[0].result == f"{tenant}-1"
        assert isinstance(outcomes[1], PermitRefused)
        assert finished[-1] == ["core", f"{tenant}-1"]  # redone item by item
        assert await _jtis(db, tenant) == [f"{tenant}-1"]
    finally:
        await db.dispose()
