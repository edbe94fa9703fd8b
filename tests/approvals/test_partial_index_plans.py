"""The lookups of a call's pending twin and standing rejections name their partial index's
status literally, so SQLite plans them on that index once, whatever values are bound (a
bound status made it re-prepare the statement at every execution to look at the value)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql import ClauseElement

from cosigner.approvals import opening, rejections
from cosigner.db.tables_approvals import approvals
from cosigner.permits import redeem


def _plan(database: Path, statement: ClauseElement) -> str:
    sql = str(statement.compile(dialect=sqlite.dialect()))
    with sqlite3.connect(database) as conn:
        # Every parameter NULL: a plan that needs the bound values cannot pick the index.
        rows = conn.execute("EXPLAIN QUERY PLAN " + sql, [None] * sql.count("?")).fetchall()
    return " | ".join(str(row[-1]) for row in rows)


@pytest.mark.parametrize("statement", [
    redeem._STANDING_REJECTION,  # noqa: SLF001
    rejections._STANDING_CALL,  # noqa: SLF001
], ids=["redeem", "decision"])
def test_standing_rejection_lookups_use_their_partial_index(sqlite_template: Path,
                                                            statement: ClauseElement) -> None:
    assert "USING INDEX ix_approvals_rejected_call" in _plan(sqlite_template, statement)


def test_the_pending_twin_lookup_uses_its_partial_index(sqlite_template: Path) -> None:
    assert "USING INDEX uq_approvals_pending_call" in _plan(
        sqlite_template, opening._PENDING_FOR_CALL)  # noqa: SLF001
    bound = select(approvals).where(
        approvals.c.tenant == "t", approvals.c.run_id == "r", approvals.c.tool == "x",
        approvals.c.args_hash == "h", approvals.c.status == "pending")
    assert "uq_approvals_pending_call" not in _plan(sqlite_template, bound)  # the old form
