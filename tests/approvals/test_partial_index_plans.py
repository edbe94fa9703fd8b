"""The lookups of a call's pending twin and standing rejections name their partial index's
status literally, so SQLite plans them on that index once, whatever values are bound (a
bound status made it re-prepare the statement at every execution to look at the value)."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql import ClauseElement

from cosigner.approvals import opening, rejections
from cosigner.db.tables_approvals import approvals
from cosigner.permits import redeem


def _plan(database: Path, statement: ClauseElement) -> str:
    # An IN list's expanding parameter spelled as its placeholders (one per status).
    sql = str(statement.compile(dialect=sqlite.dialect(),
                                compile_kwargs={"render_postcompile": True}))
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


def test_the_history_reads_the_decided_index_holding_decided_requests_only(
        sqlite_template: Path) -> None:
    """``ix_approvals_tenant_decided`` holds decided requests only (0027); the history,
    newest decision first (its default order), still reads it, with or without a date
    range and from a cursor."""
    from cosigner.approvals import listing
    from cosigner.identity.principals import Caller

    caller = Caller(tenant="t", principal_id="p", subject="key:k",
                    roles=frozenset({"auditor"}), kind="key")
    for query, after in (
            (listing.Query(pending=False, sort="decided", desc=True, size=50), None),
            (listing.Query(pending=False, sort="decided", desc=True, size=50,
                           decided_from=datetime(2026, 1, 1, tzinfo=UTC)),
             (datetime(2026, 6, 1, tzinfo=UTC), "a")),
    ):
        statement = listing._ordered(listing._filtered(  # noqa: SLF001
            select(approvals), caller, query), query, after, False)  # noqa: SLF001
        assert "USING INDEX ix_approvals_tenant_decided" in _plan(sqlite_template, statement)


def test_open_after_reviews_read_their_partial_index(sqlite_template: Path) -> None:
    """``ix_approvals_after_review`` holds break-glass requests only (0027); the list of
    open after-the-fact reviews (``status=after_review``) reads it."""
    statement = select(approvals).where(approvals.c.tenant == "t",
                                        approvals.c.after_review == "open")
    assert "USING INDEX ix_approvals_after_review" in _plan(sqlite_template, statement)


def test_an_opening_writes_neither_index(sqlite_template: Path) -> None:
    """A pending request (``decided_at``, ``after_review`` NULL) has no entry in either."""
    with sqlite3.connect(sqlite_template) as conn:
        for name in ("ix_approvals_tenant_decided", "ix_approvals_after_review"):
            (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?",
                                  (name,)).fetchone()
            assert sql.endswith("IS NOT NULL"), sql
