"""Statements on the raw sqlite3 driver (cosigner.db.raw_sql) read and write what Core does."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError

from cosigner.approvals import opening
from cosigner.db.database import Database
from cosigner.db.raw_insert import raw_sqlite
from cosigner.db.raw_sql import RawStatement, read_connection
from cosigner.db.tables import permits
from cosigner.db.tables_approvals import approvals, call_inputs
from cosigner.permits import redeem
from cosigner.permits.tokens import PermitClaims


def _claims(tenant: str, jti: str, decision_id: str, approval_id: str | None) -> PermitClaims:
    return PermitClaims(  # only the fields redeem's read uses matter here
        iss="i", aud="a", iat=0, nbf=0, exp=1, jti=jti, tenant=tenant, run="run-1",
        decision_id=decision_id, approval_id=approval_id,
        tool="t", args_hash="h", policy={"id": "p", "version": "1", "revision": "r"},
        approvers=())


async def test_redeem_read_on_the_raw_driver_equals_core(database_url: str,
                                                         tenant: str) -> None:
    db = Database(database_url)
    now = datetime(2026, 12, 1, 6, 0, 0, 654321, tzinfo=UTC)
    try:
        async with db.transaction() as conn:
            await conn.execute(permits.insert(), {
                "jti": f"{tenant}-j", "tenant": tenant, "decision_id": f"{tenant}-d",
                "approval_id": None, "run_id": "run-1", "tool": "t", "args_hash": "h",
                "status": "issued", "issued_at": now, "expires_at": now + timedelta(minutes=5),
                "redeemed_at": None, "revoked_at": None})
            await conn.execute(call_inputs.insert(), {
                "decision_id": f"{tenant}-d", "tenant": tenant,
                "input": {"args": {"n": 2**70, "s": "é"}, "tool": {"name": "t"}},
                "mask": ["/x"]})
        for jti, approval in ((f"{tenant}-j", None), (f"{tenant}-j", "nope"),
                              (f"{tenant}-missing", None)):
            claims = _claims(tenant, jti, f"{tenant}-d", approval)
            core = await redeem._read(db, tenant, claims)  # noqa: SLF001
            raw = redeem._read_raw(db, tenant, claims)  # noqa: SLF001
            if db.is_sqlite:
                assert raw is not None
                state, stored, counted = raw
                assert (state and state.status, stored, counted) == (
                    core[0] and core[0].status, core[1], core[2])
                if state is not None:
                    assert state.expires_at.replace(tzinfo=UTC) == now + timedelta(minutes=5)
            else:
                assert raw is None  # PostgreSQL keeps SQLAlchemy
        with read_connection(db) as outer, read_connection(db) as inner:
            assert inner is None  # re-entrance falls back to Core
            assert (outer is None) == (not db.is_sqlite)
    finally:
        await db.dispose()


async def test_raw_update_and_insert_in_the_batch_transaction(database_url: str,
                                                              tenant: str) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("the raw driver path is SQLite's")
    db = Database(database_url)
    now = datetime(2026, 12, 1, 6, 0, 0, tzinfo=UTC)
    values = {"id": f"{tenant}-a", "tenant": tenant, "kind": "policy", "decision_id": "d",
              "run_id": "r", "tool": "t", "args_hash": "h", "args": "{}", "mask": [],
              "requirement": {"roles": ["x"]}, "status": "pending", "initiator": {"id": "i"},
              "principal": {"id": "p"}, "opened_by": {"subject": "s"}, "reasons": [],
              "policy": None, "reason": None, "created_at": now,
              "expires_at": now + timedelta(hours=1)}
    try:
        async with db.transaction() as conn:
            assert await opening._insert(conn, values) is True  # noqa: SLF001
            # The pending twin: nothing inserted, as through Core.
            assert await opening._insert(conn, {**values, "id": f"{tenant}-b"}) is False  # noqa: SLF001
        async with db.read() as conn:
            row = (await conn.execute(select(approvals).where(
                approvals.c.tenant == tenant))).one()
        assert (row.id, row.stage, row.requirement, row.policy, row.initiator) == (
            f"{tenant}-a", 1, {"roles": ["x"]}, None, {"id": "i"})
        assert row.expires_at.replace(tzinfo=UTC) == now + timedelta(hours=1)
        flip = RawStatement(approvals.update().where(
            approvals.c.id == bindparam("a_id")).values(status="rejected"))
        async with db.transaction() as conn:
            raw = await raw_sqlite(conn)
            assert raw is not None
            assert flip.run(raw, conn.dialect, {"a_id": f"{tenant}-a"})[1] == 1
            assert flip.run(raw, conn.dialect, {"a_id": "nothing"})[1] == 0
            # A driver error is SQLAlchemy's, so the batch maps it as before.
            dup = RawStatement(approvals.insert().values(
                {name: bindparam(name) for name in values}))
            with pytest.raises(IntegrityError):
                dup.run(raw, conn.dialect, {**values, "id": f"{tenant}-a"})
    finally:
        await db.dispose()
