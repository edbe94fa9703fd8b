"""The allow batch on PostgreSQL's own driver (cosigner.db.raw_pg) reads and writes what
the SQLAlchemy path does, and fails the way it does.

* the guard's three reads answer as their SQLAlchemy originals on the same rows;
* prepared decisions really take the asyncpg path, and what it wrote reads back through
  SQLAlchemy as the answers said (decision rows, permits, stored inputs, an unbroken
  chain);
* a unique key or a value PostgreSQL refuses in the raw batch: the batch is redone item
  by item, only the culprit fails; a lost connection: 503 for the batch, nothing kept,
  the next batch reconnects.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import func, select

from cosigner.approvals import rejections
from cosigner.audit.chain import Event, verify_bodies
from cosigner.db import compressed, digest, raw_pg, response_row
from cosigner.db.batch import Write
from cosigner.db.database import UniqueViolation
from cosigner.db.tables import audit_events, decisions, permits
from cosigner.db.tables_approvals import approvals, call_inputs
from cosigner.db.tables_runs import runs
from cosigner.decisions import pdp
from cosigner.runs import contracts
from tests.conftest import decision_request
from tests.decisions.test_guard_sql import _approval, _run

NOW = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _postgres_only(db_kind: str) -> None:
    if db_kind != "postgres":
        pytest.skip("the asyncpg batch is PostgreSQL's (SQLite: test_guard_sql.py)")


async def test_raw_pg_guard_reads_equal_sqlalchemy(harness: Any, tenant: str) -> None:
    other = tenant + "-b"
    headers = await harness.headers(tenant, "runtime")
    for i in range(3):
        resp = await harness.client.post("/v1/decisions", headers=headers,
                                         json=decision_request(request_id=f"req-{i}"))
        assert resp.status_code == 200, resp.text
    statuses = ["rejected", "pending", "approved", "rejected", "rejected"]
    r1, r2 = f"{tenant}-r1", f"{tenant}-r2"  # the shared database holds other tests' runs
    async with harness.db.transaction() as conn:
        await conn.execute(runs.insert(), [_run(tenant, r1), _run(other, r2)])
        await conn.execute(approvals.insert(), [
            _approval(i, t, run_id, statuses[i], withdrawn=i == 4)
            for i, (t, run_id) in enumerate([(tenant, r1), (tenant, r1), (tenant, r2),
                                             (other, r2), (tenant, "r3")])])
    link = raw_pg.PgLink(harness.db)
    try:
        async with harness.db.transaction() as conn, link.transaction() as pg:
            dialect = conn.dialect
            requests = {(tenant, f"req-{i}") for i in range(5)} | {(other, "req-0")}
            want = await pdp._decided(conn, requests)
            pairs = {(tenant, r1), (tenant, r2), (other, r2), (other, r1), (tenant, "x")}
            calls = {(t, r, "issue_refund", f"sha256:{i:064x}")
                     for i in range(6) for t in (tenant, other) for r in (r1, r2, "r3")}
            got = await raw_pg.guard_reads(pg, dialect, requests, pairs, calls)
            assert set(got.decided) == set(want) == {(tenant, f"req-{i}") for i in range(3)}
            for key, row in want.items():
                assert got.decided[key] == (key[1], row.request_hash,
                                            dict(response_row.answer(row)))
            assert got.contracted == await contracts.contracted(conn, pairs)
            assert got.contracted == {(tenant, r1), (other, r2)}
            want_calls = await rejections.rejected_calls(conn, calls)
            assert got.rejected == want_calls
            assert want_calls == {(tenant, r1, "issue_refund", f"sha256:{0:064x}"),
                                  (other, r2, "issue_refund", f"sha256:{3:064x}")}
            # Nothing asked, nothing found; one kind asked alone.
            assert await raw_pg.guard_reads(pg, dialect, set(), set(), set()) == (
                {}, set(), set())
            alone = await raw_pg.guard_reads(pg, dialect, set(), pairs, set())
            assert alone == ({}, {(tenant, r1), (other, r2)}, set())
    finally:
        await link.close()


def _count_raw(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count batches run on the asyncpg path (entered transactions)."""
    entered = [0]
    original = raw_pg.PgLink.transaction

    def counting(self: raw_pg.PgLink) -> Any:
        entered[0] += 1
        return original(self)

    monkeypatch.setattr(raw_pg.PgLink, "transaction", counting)
    return entered


async def test_allow_batches_run_on_asyncpg_and_read_back_as_answered(
        harness: Any, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    entered = _count_raw(monkeypatch)
    headers = await harness.headers(tenant, "runtime")
    bodies = []
    for i in range(40):
        body = decision_request(request_id=f"req-{i}")
        body["args"]["amount_minor"] = [5000, 250000][i % 2]  # allow, deny
        bodies.append(body)
    answers = await asyncio.gather(*(harness.client.post(
        "/v1/decisions", headers=headers, json=b) for b in bodies))
    assert [a.status_code for a in answers] == [200] * 40
    assert entered[0] >= 1
    assert harness.context.log_writer.stats.batches < 40
    by_id = {a.json()["decision_id"]: a.json() for a in answers}
    assert {a["effect"] for a in by_id.values()} == {"allow", "deny"}
    again = await harness.client.post("/v1/decisions", headers=headers, json=bodies[0])
    assert again.json() == answers[0].json()  # a retry: the guard's read, first answer
    async with harness.db.read() as conn:
        rows = (await conn.execute(select(  # with what a form 3/7 response refers to
            decisions.c.id, decisions.c.request_id, decisions.c.args_hash,
            decisions.c.policy_revision, decisions.c.run_id, decisions.c.response).where(
            decisions.c.tenant == tenant))).all()
        jtis = (await conn.execute(select(permits.c.jti).where(
            permits.c.tenant == tenant))).scalars().all()
        inputs = (await conn.execute(select(func.count()).select_from(call_inputs).where(
            call_inputs.c.tenant == tenant))).scalar_one()
        chain = (await conn.execute(select(audit_events.c.body, audit_events.c.hash)
                                    .where(audit_events.c.tenant == tenant)
                                    .order_by(audit_events.c.seq))).all()
    assert {row.id: dict(response_row.answer(row)) for row in rows} == by_id
    assert len(jtis) == inputs == 20
    made = [r for r in chain if '"type":"decision.made"' in r.body]
    minted = [r for r in chain if '"type":"permit.minted"' in r.body]
    assert (len(made), len(minted)) == (40, 20)
    assert verify_bodies([(r.body, r.hash) for r in chain]) == (None, None)


def _decision_row(tenant: str, i: int, **overrides: Any) -> dict[str, Any]:
    row = {"id": f"{tenant}-d{i}", "tenant": tenant, "request_id": f"{tenant}-q{i}",
           "request_hash": "sha256:0", "run_id": "run", "tool": "t", "args_hash": "sha256:0",
           "effect": "deny", "caller": "c", "policy_id": None, "policy_version": None,
           "policy_revision": None, "response": {"i": i}, "created_at": NOW}
    row.update(overrides)
    return row


def _write(tenant: str, i: int, **overrides: Any) -> Write:
    return Write(tenant, [Event(type="test.noted", actor={"subject": "t"},
                                payload={"i": i})], i,
                 [(decisions, _decision_row(tenant, i, **overrides))])


async def _kept(harness: Any, tenant: str) -> tuple[list[str], int]:
    async with harness.db.read() as conn:
        ids = (await conn.execute(select(decisions.c.id).where(
            decisions.c.tenant == tenant).order_by(decisions.c.id))).scalars().all()
        events = (await conn.execute(select(func.count()).select_from(audit_events).where(
            audit_events.c.tenant == tenant))).scalar_one()
    return list(ids), events


async def test_a_refused_row_fails_alone_after_a_redo(harness: Any, tenant: str,
                                                      monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """A duplicate primary key and a value too long for its column, each in a raw batch
    with good writes: the batch is redone item by item (SQLAlchemy), only they fail."""
    entered = _count_raw(monkeypatch)
    writer = harness.context.log_writer
    outcomes = await asyncio.gather(
        writer.submit(_write(tenant, 1)), writer.submit(_write(tenant, 1, request_id="x")),
        writer.submit(_write(tenant, 2)), writer.submit(_write(tenant, 3, id="x" * 40)),
        writer.submit(_write(tenant, 4)), return_exceptions=True)
    assert entered[0] >= 1
    assert isinstance(outcomes[1], UniqueViolation)
    assert outcomes[3].code == "storage_unavailable"  # type: ignore[union-attr]
    assert [outcomes[i].result for i in (0, 2, 4)] == [1, 2, 4]  # type: ignore[union-attr]
    assert await _kept(harness, tenant) == ([f"{tenant}-d{i}" for i in (1, 2, 4)], 3)


async def test_a_lost_connection_answers_503_keeps_nothing_and_reconnects(
        harness: Any, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    headers = await harness.headers(tenant, "runtime")
    original = raw_pg.guard_reads
    before = await _kept(harness, tenant)  # the key's creation event

    async def killed(conn: Any, *args: Any) -> Any:
        await conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        raise AssertionError("unreachable")

    monkeypatch.setattr(raw_pg, "guard_reads", killed)
    answers = await asyncio.gather(*(harness.client.post(
        "/v1/decisions", headers=headers, json=decision_request(request_id=f"r-{i}"))
        for i in range(6)))
    assert {a.status_code for a in answers} == {503}
    assert {a.json()["code"] for a in answers} == {"storage_unavailable"}
    assert await _kept(harness, tenant) == before == ([], 1)
    monkeypatch.setattr(raw_pg, "guard_reads", original)
    ok = await harness.client.post("/v1/decisions", headers=headers,
                                   json=decision_request(request_id="r-0"))
    assert ok.status_code == 200, ok.text
    assert len((await _kept(harness, tenant))[0]) == 1


async def test_rows_written_raw_equal_rows_written_by_core(
        harness: Any, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows of real allow and deny decisions, as stored by the raw batch, byte for
    byte equal the same rows inserted by SQLAlchemy Core (keys renamed), every column."""
    import asyncpg

    captured: list[Any] = []
    original = raw_pg.insert_tables

    async def capture(conn: Any, dialect: Any, groups: Any) -> None:
        captured.extend(groups)
        await original(conn, dialect, groups)

    monkeypatch.setattr(raw_pg, "insert_tables", capture)
    headers = await harness.headers(tenant, "runtime")
    for i, amount in enumerate((5000, 250000)):
        body = decision_request(request_id=f"req-{i}")
        body["args"]["amount_minor"] = amount
        assert (await harness.client.post("/v1/decisions", headers=headers,
                                          json=body)).status_code == 200
    tables = {table.name for table, _ in captured}
    assert tables == {"decisions", "permits", "call_inputs"}
    keys = {"decisions": "id", "permits": "jti", "call_inputs": "decision_id"}
    copies = [(table, [{**row, keys[table.name]: row[keys[table.name]][:30] + "-core",
                        **({"request_id": row["request_id"] + "-core"}
                           if table.name == "decisions" else {})} for row in rows])
              for table, rows in captured]
    async with harness.db.transaction() as conn:
        for table, rows in copies:
            await conn.execute(table.insert(), rows)
    dsn = harness.settings.database_url.replace("postgresql+asyncpg://", "postgresql://")
    pg = await asyncpg.connect(dsn)
    formed: set[int] = set()
    try:
        for table, rows in captured:
            key = keys[table.name]
            for row in rows:
                raw = await pg.fetchrow(f"SELECT * FROM {table.name} WHERE {key} = $1",
                                        row[key])
                core = await pg.fetchrow(f"SELECT * FROM {table.name} WHERE {key} = $1",
                                         row[key][:30] + "-core")
                assert raw is not None and core is not None
                differ = {name for name in raw.keys() if raw[name] != core[name]}
                if table.name == "decisions":  # raw: against its row (forms 3, 7, 8)
                    read = compressed.ResponseJSON().process_result_value
                    assert response_row.resolve(read(raw["response"], None), (  # type: ignore[arg-type]
                        raw["id"], raw["request_id"], digest.unpack(raw["args_hash"]),
                        digest.unpack(raw["policy_revision"]), raw["run_id"])) == read(
                            core["response"], None)  # type: ignore[arg-type]
                    formed.add(bytes(raw["response"])[0])
                    differ.discard("response")
                assert differ <= {key, "request_id"}, (table.name, differ)
        assert formed == {1, 8}  # the allow's answer in form 8 (facts), the approval's in form 1
    finally:
        await pg.close()


async def test_the_urls_statement_cache_size_reaches_the_batch_connection(
        database_url: str) -> None:
    """``?prepared_statement_cache_size=0`` (SQLAlchemy's asyncpg option, e.g. behind a
    transaction-pooling PgBouncer) turns asyncpg's statement cache off on the batch's own
    connection too (found in review, session 5)."""
    from cosigner.db.database import Database

    sep = "&" if "?" in database_url else "?"
    db = Database(database_url + f"{sep}prepared_statement_cache_size=0")
    try:
        link = raw_pg.PgLink(db)
        conn = await link.connect()
        assert conn._stmt_cache.get_max_size() == 0  # noqa: SLF001
        # No statement kept, so no plan kept: the pooler's server session is left as is.
        assert await conn.fetchval("SHOW plan_cache_mode") == "auto"
    finally:
        await db.dispose()


async def test_generic_plans_on_empty_tables_probe_the_unique_keys(harness: Any) -> None:
    """The link keeps each statement's generic plan (``plan_cache_mode``), so that plan
    must search the right index even when planned on empty, never analysed tables (a
    fresh database): before session 9 the head's ``EXISTS (… seq = …)`` searched
    ``(tenant, time)`` and filtered on seq, and the guard scanned ``decisions``, for the
    life of the connection. Empty copies of the tables (temporary: they hide the shared
    database's own) stand for a fresh database."""
    link = raw_pg.PgLink(harness.db)
    try:
        async with link.transaction() as pg:
            assert await pg.fetchval("SHOW plan_cache_mode") == "force_generic_plan"
            for name in ("decisions", "runs", "approvals", "audit_events", "audit_heads"):
                await pg.execute(f"CREATE TEMP TABLE {name} (LIKE public.{name} "
                                 "INCLUDING ALL) ON COMMIT DROP")
            await pg.execute(f"PREPARE s9_guard AS {raw_pg._GUARD}")  # noqa: SLF001
            await pg.execute(f"PREPARE s9_head AS {raw_pg._HEAD}")  # noqa: SLF001
            guard = "\n".join(r[0] for r in await pg.fetch(
                "EXPLAIN EXECUTE s9_guard('{t}', '{r}', '{t}', '{r}', '{t}', '{r}', "
                "'{x}', '{h}')"))
            head = "\n".join(r[0] for r in await pg.fetch("EXPLAIN EXECUTE s9_head('t')"))
            await pg.execute("DEALLOCATE s9_guard")
            await pg.execute("DEALLOCATE s9_head")
            raise _Rollback
    except _Rollback:
        pass
    finally:
        await link.close()
    assert "Seq Scan" not in guard and "Filter: ((k.r)" in guard, guard
    conds = [line.strip() for line in guard.splitlines() if "Index Cond" in line]
    assert len(conds) == 3, guard
    assert "(request_id)::text >= (k.r)::text" in conds[0], guard
    assert "run_id >= (k_1.r)::text" in conds[1], guard
    assert "args_hash >= (k_2.h)::text" in conds[2] and "tool = " in conds[2], guard
    assert "Index Cond: ((tenant = (h.tenant)::text) AND (seq >= h.seq))" in head, head


async def test_the_core_head_lock_probes_the_seq_key_on_empty_tables(harness: Any) -> None:
    """The SQLAlchemy path's head lock (:mod:`cosigner.audit.chain`, a redo item by item
    and every approval write) as its generic plan on a fresh database: a probe of the
    ``(tenant, seq)`` key, as the raw link's (its ``EXISTS (… seq = …)`` searched
    ``(tenant, time)`` and filtered on seq before session 9)."""
    from sqlalchemy.dialects.postgresql import asyncpg as pg_asyncpg

    from cosigner.audit import chain

    sql = str(chain._HEAD_FOR_UPDATE.compile(dialect=pg_asyncpg.dialect()))  # noqa: SLF001
    link = raw_pg.PgLink(harness.db)
    try:
        async with link.transaction() as pg:
            for name in ("audit_events", "audit_heads"):
                await pg.execute(f"CREATE TEMP TABLE {name} (LIKE public.{name} "
                                 "INCLUDING ALL) ON COMMIT DROP")
            await pg.execute(f"PREPARE s9_core_head AS {sql}")
            plan = "\n".join(r[0] for r in await pg.fetch(
                "EXPLAIN EXECUTE s9_core_head(1, 't')"))
            await pg.execute("DEALLOCATE s9_core_head")
            raise _Rollback
    except _Rollback:
        pass
    finally:
        await link.close()
    assert "Index Cond: ((tenant = (audit_heads.tenant)::text) AND (seq >= audit_heads.seq))" \
        in plan, plan


class _Rollback(Exception):
    pass


@pytest.mark.parametrize("order", ["reversed", "without the nullable policy columns"])
async def test_records_in_any_key_order_or_subset_equal_core_rows(
        harness: Any, tenant: str, order: str) -> None:
    """Rows go in as records of the table's row type (session 10): whatever the rows' key
    order, and with columns left out (their default, NULL), each column lands where Core
    puts it; a key that is no column is refused before anything is sent."""
    import asyncpg

    rows = [_decision_row(tenant, i, effect="allow", policy_id="p", policy_version="2")
            for i in range(3)]
    if order == "reversed":
        rows = [dict(reversed(list(row.items()))) for row in rows]
    else:
        rows = [{k: v for k, v in row.items() if not k.startswith("policy_")}
                for row in rows]
    core = [{**row, "id": row["id"] + "-core", "request_id": row["request_id"] + "-core"}
            for row in rows]
    link = raw_pg.PgLink(harness.db)
    dialect = harness.db.engine.dialect
    try:
        async with link.transaction() as conn:
            await raw_pg.insert_tables(conn, dialect, [(decisions, rows)])
            fields = await raw_pg._fields(conn, decisions)  # noqa: SLF001
        async with harness.db.transaction() as sa:
            await sa.execute(decisions.insert(), core)
        with pytest.raises(ValueError, match="not columns of decisions"):
            async with link.transaction() as conn:
                await raw_pg.insert_tables(conn, dialect, [(decisions, [{**rows[0], "x": 1}])])
    finally:
        await link.close()
    dsn = harness.settings.database_url.replace("postgresql+asyncpg://", "postgresql://")
    pg = await asyncpg.connect(dsn)
    try:
        for row in rows:
            raw = await pg.fetchrow("SELECT * FROM decisions WHERE id = $1", row["id"])
            copy = await pg.fetchrow("SELECT * FROM decisions WHERE id = $1",
                                     row["id"] + "-core")
            assert raw is not None and copy is not None
            assert tuple(raw.keys()) == fields
            assert {k for k in raw.keys() if raw[k] != copy[k]} == {"id", "request_id"}
            assert (raw["effect"], raw["policy_id"]) == (
                ("allow", "p") if order == "reversed" else ("allow", None))
    finally:
        await pg.close()


async def test_a_table_changed_under_the_cached_row_type_fails_once_then_inserts(
        harness: Any, tenant: str) -> None:
    """The row types are read once per connection; when a table gains a column (another
    process's migration), the next raw insert is refused (the batch would be redone item
    by item through Core), the caches are dropped, and the one after goes in."""
    from sqlalchemy import Column, Integer

    name = f"s10_{tenant.replace('-', '_')}"
    scratch = await _scratch_table(harness, name, Column("v", Integer))
    link = raw_pg.PgLink(harness.db)
    dialect = harness.db.engine.dialect
    try:
        async with link.transaction() as conn:
            await raw_pg.insert_tables(conn, dialect, [(scratch, [{"k": "a", "v": 1}])])
        async with harness.db.transaction() as sa:
            await sa.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN w integer DEFAULT 7")
        with pytest.raises(Exception) as failed:  # noqa: PT011 - mapped as any DB error
            async with link.transaction() as conn:
                await raw_pg.insert_tables(conn, dialect, [(scratch, [{"k": "b", "v": 2}])])
        assert failed.value.code == "storage_unavailable"  # type: ignore[attr-defined]
        async with link.transaction() as conn:
            await raw_pg.insert_tables(conn, dialect, [(scratch, [{"v": 3, "k": "c"}])])
            rows = await conn.fetch(f"SELECT k, v, w FROM {name} ORDER BY k")
        assert [tuple(r) for r in rows] == [("a", 1, 7), ("c", 3, 7)]
    finally:
        await link.close()
        async with harness.db.transaction() as sa:
            await sa.exec_driver_sql(f"DROP TABLE {name}")


@pytest.mark.parametrize("change", ["a dropped and added back", "a and b renamed"])
async def test_a_column_recreated_under_the_cached_row_type_never_lands_in_another(
        harness: Any, tenant: str, change: str) -> None:
    """A migration that drops a column and adds it back (or swaps two names) moves it
    in the table's row type, while this connection's cached layout (and asyncpg's codec
    for the row type) still has the old order: two columns of one type would trade
    values silently. The insert is refused instead (redone item by item through Core),
    the caches are dropped, and the next one lands each value in its column."""
    from sqlalchemy import Column, Text

    name = f"s10r_{tenant.replace('-', '_')}"
    scratch = await _scratch_table(harness, name, Column("a", Text), Column("b", Text))
    link = raw_pg.PgLink(harness.db)
    dialect = harness.db.engine.dialect
    try:
        async with link.transaction() as conn:
            await raw_pg.insert_tables(conn, dialect,
                                       [(scratch, [{"k": "1", "a": "A", "b": "B"}])])
        async with harness.db.transaction() as sa:
            if change == "a and b renamed":
                for old, new in (("a", "t"), ("b", "a"), ("t", "b")):
                    await sa.exec_driver_sql(f"ALTER TABLE {name} RENAME {old} TO {new}")
            else:
                await sa.exec_driver_sql(f"ALTER TABLE {name} DROP COLUMN a")
                await sa.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN a text")
        with pytest.raises(Exception) as failed:  # noqa: PT011 - mapped as any DB error
            async with link.transaction() as conn:
                await raw_pg.insert_tables(conn, dialect,
                                           [(scratch, [{"k": "2", "a": "A", "b": "B"}])])
        assert failed.value.code == "storage_unavailable"  # type: ignore[attr-defined]
        async with link.transaction() as conn:
            await raw_pg.insert_tables(conn, dialect,
                                       [(scratch, [{"k": "3", "a": "A", "b": "B"}])])
            rows = await conn.fetch(f"SELECT k, a, b FROM {name} ORDER BY k")
        first = ("1", "B", "A") if change == "a and b renamed" else ("1", None, "B")
        assert [tuple(r) for r in rows] == [first, ("3", "A", "B")]
    finally:
        await link.close()
        async with harness.db.transaction() as sa:
            await sa.exec_driver_sql(f"DROP TABLE {name}")


async def _scratch_table(harness: Any, name: str, *columns: Any) -> Any:
    """A new table ``name`` (key ``k``, then ``columns``), created in the database."""
    from sqlalchemy import Column, MetaData, String, Table

    scratch = Table(name, MetaData(), Column("k", String(36), primary_key=True), *columns)
    async with harness.db.transaction() as sa:
        await sa.run_sync(scratch.metadata.create_all)
    return scratch
