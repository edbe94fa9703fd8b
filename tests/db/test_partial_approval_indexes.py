"""Migration 0027: the approvals' decided and after-review indexes hold only the rows they
serve, on SQLite and PostgreSQL; the rows and what the history reads are unchanged, up,
down and up again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from alembic import command
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from cosigner.db.migrate import alembic_config, upgrade
from cosigner.db.tables_approvals import approvals
from tests.db.test_migrate import empty_database  # noqa: F401 - fixture

BEFORE = "0026_s14store_answer_facts"
INDEXES = ("ix_approvals_tenant_decided", "ix_approvals_after_review")
OPENED = datetime(2026, 12, 6, 12, tzinfo=UTC)


def _to(connection: Any, url: str, revision: str, down: bool = False) -> None:
    cfg = alembic_config(url)
    cfg.attributes["connection"] = connection
    (command.downgrade if down else command.upgrade)(cfg, revision)


def _row(i: int, status: str, *, decided: bool, after_review: str | None) -> dict[str, Any]:
    return {
        "id": f"01a242a9-09bd-71c2-8064-52c3fd4e8f{i:02x}", "tenant": "t-s15i",
        "kind": "policy", "decision_id": f"01a242a9-09bd-71c2-8064-52c3fd4e8e{i:02x}",
        "run_id": f"run-{i}", "tool": "issue_refund", "args_hash": "sha256:" + "ab" * 32,
        "args": "{}", "mask": [], "requirement": {"groups": []}, "status": status,
        "initiator": {"id": "agent"}, "principal": {"id": "customer"},
        "opened_by": {"sub": "key:k"}, "reasons": [], "policy": None, "reason": None,
        "created_at": OPENED + timedelta(minutes=i),
        "expires_at": OPENED + timedelta(hours=1),
        "decided_at": OPENED + timedelta(minutes=30 + i) if decided else None,
        "after_review": after_review}


async def _definitions(engine: AsyncEngine) -> dict[str, str]:
    async with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            rows = (await conn.execute(text(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'approvals'"))).all()
        else:
            rows = (await conn.execute(text(
                "SELECT name, sql FROM sqlite_master WHERE tbl_name = 'approvals'"))).all()
    return {name: sql for name, sql in rows if name in INDEXES}


async def _history(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        return list((await conn.execute(
            select(approvals.c.id).where(approvals.c.tenant == "t-s15i",
                                         approvals.c.decided_at.is_not(None))
            .order_by(approvals.c.decided_at.desc(), approvals.c.id.desc()))).scalars())


async def _open_reviews(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        return list((await conn.execute(
            select(approvals.c.id).where(approvals.c.tenant == "t-s15i",
                                         approvals.c.after_review == "open")
            .order_by(approvals.c.id))).scalars())


async def test_0027_partial_indexes_up_down_and_up_again(empty_database: str) -> None:  # noqa: F811
    url = empty_database
    engine = create_async_engine(url)
    rows = [_row(0, "pending", decided=False, after_review=None),
            _row(1, "approved", decided=True, after_review=None),
            _row(2, "rejected", decided=True, after_review=None),
            _row(3, "approved", decided=True, after_review="open"),
            _row(4, "approved", decided=True, after_review="done")]
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, BEFORE)
            await conn.execute(approvals.insert(), rows)
        full = await _definitions(engine)
        assert set(full) == set(INDEXES) and not any("WHERE" in sql.upper()
                                                     for sql in full.values())
        history, reviews = await _history(engine), await _open_reviews(engine)
        assert history == [rows[i]["id"] for i in (4, 3, 2, 1)]
        assert reviews == [rows[3]["id"]]

        await upgrade(url)
        partial = await _definitions(engine)
        assert "decided_at IS NOT NULL" in partial["ix_approvals_tenant_decided"]
        assert "after_review IS NOT NULL" in partial["ix_approvals_after_review"]
        assert await _history(engine) == history and await _open_reviews(engine) == reviews

        async with engine.begin() as conn:
            await conn.run_sync(_to, url, BEFORE, True)
        again = await _definitions(engine)
        assert not any("WHERE" in sql.upper() for sql in again.values())
        assert await _history(engine) == history and await _open_reviews(engine) == reviews

        await upgrade(url)
        assert await _definitions(engine) == partial
    finally:
        await engine.dispose()
