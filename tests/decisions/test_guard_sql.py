"""The group-commit guard's raw-SQLite reads answer exactly as their SQLAlchemy originals.

Rows written through the real app (decisions) and SQLAlchemy Core (runs, approvals in
every status, withdrawn or not, other tenants); then, inside one write transaction,
every guard query is asked both ways with hits, misses and cross-tenant pairs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from cosigner.approvals import rejections
from cosigner.db import response_row
from cosigner.db.raw_insert import raw_sqlite
from cosigner.db.tables_approvals import approvals
from cosigner.db.tables_runs import runs
from cosigner.decisions import guard_sql, pdp
from cosigner.runs import contracts
from tests.conftest import decision_request

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _approval(i: int, tenant: str, run_id: str, status: str, withdrawn: bool) -> dict[str, Any]:
    return {"id": f"a-{tenant}-{i}", "tenant": tenant, "kind": "policy", "decision_id": f"d{i}",
            "run_id": run_id, "tool": "issue_refund", "args_hash": f"sha256:{i:064x}",
            "args": "{}", "mask": [], "requirement": {}, "status": status,
            "initiator": {}, "principal": {}, "opened_by": {}, "reasons": [],
            "created_at": NOW, "expires_at": NOW,
            "withdrawn_at": NOW if withdrawn else None}


def _run(tenant: str, run_id: str) -> dict[str, Any]:
    return {"tenant": tenant, "run_id": run_id, "contract": {}, "contract_hash": "sha256:0",
            "tool_calls": 0, "cost_minor": 0, "tool_counts": {}, "created_by": "t",
            "created_at": NOW, "updated_at": NOW}


async def test_raw_guard_reads_equal_sqlalchemy(harness: Any, tenant: str,
                                                db_kind: str) -> None:
    if db_kind != "sqlite":
        pytest.skip("the raw guard is SQLite's; PostgreSQL runs the SQLAlchemy queries")
    other = tenant + "-b"
    headers = await harness.headers(tenant, "runtime")
    first: list[str] = []
    for i in range(3):
        body = decision_request(request_id=f"req-{i}")
        resp = await harness.client.post("/v1/decisions", json=body, headers=headers)
        assert resp.status_code == 200, resp.text
        first.append(resp.json()["decision_id"])
    statuses = ["rejected", "pending", "approved", "rejected", "rejected"]
    async with harness.db.transaction() as conn:
        await conn.execute(runs.insert(), [_run(tenant, "r1"), _run(other, "r2")])
        await conn.execute(approvals.insert(), [
            _approval(i, t, run_id, statuses[i], withdrawn=i == 4)
            for i, (t, run_id) in enumerate([(tenant, "r1"), (tenant, "r1"), (tenant, "r2"),
                                             (other, "r2"), (tenant, "r3")])])
    async with harness.db.transaction() as conn:
        raw = await raw_sqlite(conn)
        assert raw is not None
        requests = {(tenant, f"req-{i}") for i in range(5)} | {(other, "req-0")}
        want = await pdp._decided(conn, requests)
        got = guard_sql.decided(raw, conn.dialect, requests)
        assert set(got) == set(want) == {(tenant, f"req-{i}") for i in range(3)}
        for key, row in want.items():
            assert (got[key].request_hash, got[key].response) == (row.request_hash,
                                                                   dict(response_row.answer(row)))
        pairs = {(tenant, "r1"), (tenant, "r2"), (other, "r2"), (other, "r1"), (tenant, "x")}
        assert guard_sql.contracted(raw, pairs) == await contracts.contracted(conn, pairs)
        assert guard_sql.contracted(raw, pairs) == {(tenant, "r1"), (other, "r2")}
        calls = {(t, r, "issue_refund", f"sha256:{i:064x}")
                 for i in range(6) for t in (tenant, other) for r in ("r1", "r2", "r3")}
        want_calls = await rejections.rejected_calls(conn, calls)
        assert guard_sql.rejected_calls(raw, calls) == want_calls
        assert want_calls == {(tenant, "r1", "issue_refund", f"sha256:{0:064x}"),
                              (other, "r2", "issue_refund", f"sha256:{3:064x}")}


def test_datetime_memo_formats_like_sqlalchemy() -> None:
    """The raw insert's remembered DateTime text equals SQLAlchemy's for repeats, equal
    instants at another offset, naive values and None."""
    from datetime import timedelta, timezone

    from sqlalchemy.dialects import sqlite as sqlite_dialect

    from cosigner.db.raw_insert import sqlite_rows
    from cosigner.db.tables import decisions

    dialect = sqlite_dialect.dialect()
    proc = decisions.c.created_at.type.dialect_impl(dialect).bind_processor(dialect)
    plus1 = timezone(timedelta(hours=1))
    values = [NOW, NOW, NOW.astimezone(plus1), NOW, NOW.replace(tzinfo=None),
              NOW + timedelta(microseconds=1), NOW.astimezone(plus1), None, NOW]
    _, params = sqlite_rows(dialect, decisions, [{"created_at": v} for v in values])
    assert [p[0] for p in params] == [proc(v) if v is not None else None for v in values]


async def test_raw_batch_failure_answers_503_and_records_nothing(
        harness: Any, tenant: str, db_kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database error inside the raw SQLite batch (here: the guard's read) rolls the
    whole batch back and answers 503 to every waiter, as the SQLAlchemy path does."""
    import asyncio
    import sqlite3

    from sqlalchemy import func, select

    from cosigner.db.raw_insert import sqlite_query
    from cosigner.db.tables import audit_events, decisions

    if db_kind != "sqlite":
        pytest.skip("the raw batch is SQLite's")
    headers = await harness.headers(tenant, "runtime")

    def broken(raw: sqlite3.Connection, pairs: set[tuple[str, str]]) -> set[tuple[str, str]]:
        sqlite_query(raw, "SELECT no_such_column FROM runs")
        raise AssertionError("unreachable")

    async def counts() -> list[int]:
        async with harness.db.read() as conn:
            return [(await conn.execute(select(func.count()).select_from(table).where(
                table.c.tenant == tenant))).scalar_one() for table in (decisions,
                                                                       audit_events)]

    before = await counts()
    monkeypatch.setattr(guard_sql, "contracted", broken)
    responses = await asyncio.gather(*(
        harness.client.post("/v1/decisions", headers=headers,
                            json=decision_request(request_id=f"r-{i}")) for i in range(6)))
    assert {r.status_code for r in responses} == {503}
    assert {r.json()["code"] for r in responses} == {"storage_unavailable"}
    monkeypatch.undo()
    assert await counts() == before  # nothing of the failed batches was kept
    ok = await harness.client.post("/v1/decisions", headers=headers,
                                   json=decision_request(request_id="r-0"))
    assert ok.status_code == 200, ok.text
