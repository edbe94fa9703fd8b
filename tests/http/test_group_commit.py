"""Decisions through the group committer: shared batches, every answer logged, failures 503."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import func, select

from cosigner.audit.chain import verify_bodies
from cosigner.db.tables import audit_events, decisions
from tests.conftest import Harness, decision_request


async def test_concurrent_decisions_share_commits_and_all_are_logged(harness: Harness,
                                                                    tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    bodies = []
    for i in range(60):
        body = decision_request()
        body["args"]["amount_minor"] = [5000, 150000, 250000][i % 3]
        body["run"] = {"id": f"run-{i}"}
        bodies.append(body)
    responses = await asyncio.gather(*(
        harness.client.post("/v1/decisions", headers=headers, json=b) for b in bodies))
    assert [r.status_code for r in responses] == [200] * 60
    ids = {r.json()["decision_id"] for r in responses}
    assert len(ids) == 60
    async with harness.db.read() as conn:
        made = (await conn.execute(select(audit_events.c.decision_id).where(
            audit_events.c.tenant == tenant, audit_events.c.type == "decision.made"))
        ).scalars().all()
        rows = (await conn.execute(select(audit_events.c.body, audit_events.c.hash)
                                   .where(audit_events.c.tenant == tenant)
                                   .order_by(audit_events.c.seq))).all()
    assert set(made) == ids and len(made) == 60
    assert verify_bodies([(r.body, r.hash) for r in rows]) == (None, None)
    stats = harness.context.log_writer.stats
    assert stats.batches < stats.items  # decisions really shared transactions


async def test_concurrent_retries_of_one_request_get_one_decision(harness: Harness,
                                                                  tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    body = decision_request()
    responses = await asyncio.gather(*(
        harness.client.post("/v1/decisions", headers=headers, json=body) for _ in range(20)))
    assert {r.status_code for r in responses} == {200}
    assert len({r.json()["decision_id"] for r in responses}) == 1
    async with harness.db.read() as conn:
        count = (await conn.execute(select(func.count()).select_from(decisions).where(
            decisions.c.tenant == tenant))).scalar_one()
    assert count == 1


async def test_k22_failed_batch_answers_503_and_records_nothing(harness: Harness,
                                                                tenant: str) -> None:
    headers = await harness.headers(tenant, "runtime")
    writer = harness.context.log_writer
    original = writer._run_batch

    async def broken(items: list[Any]) -> list[Any]:
        raise OSError("disk I/O error")

    writer._run_batch = broken
    try:
        responses = await asyncio.gather(*(
            harness.client.post("/v1/decisions", headers=headers, json=decision_request())
            for _ in range(10)))
    finally:
        writer._run_batch = original
    assert {r.status_code for r in responses} == {503}
    assert {r.json()["code"] for r in responses} == {"storage_unavailable"}
    async with harness.db.read() as conn:
        count = (await conn.execute(select(func.count()).select_from(decisions).where(
            decisions.c.tenant == tenant))).scalar_one()
    assert count == 0
    ok = await harness.client.post("/v1/decisions", headers=headers, json=decision_request())
    assert ok.status_code == 200


async def test_work_items_share_the_batch_and_a_refused_one_fails_alone(
        harness: Harness, tenant: str) -> None:
    """Work items run without a savepoint each first; when the database refuses one, or
    one raises a refusal after writing, the batch is rolled back and redone item by item:
    only that item fails, its writes are gone, the others commit with their events."""
    from cosigner.audit.chain import Event
    from cosigner.core.errors import Conflict
    from cosigner.db import response_row
    from cosigner.db.batch import Write
    from cosigner.db.database import UniqueViolation

    headers = await harness.headers(tenant, "runtime")
    first = (await harness.client.post("/v1/decisions", headers=headers,
                                       json=decision_request())).json()
    async with harness.db.read() as conn:
        read = (await conn.execute(select(decisions).where(
            decisions.c.id == first["decision_id"]))).one()
    # The answer resolved against its row (stored form 3 refers to the row's columns).
    row = {**read._mapping, "response": response_row.answer(read)}

    async def duplicate(conn: Any) -> Write:
        await conn.execute(decisions.insert(), row)  # same primary key: refused
        return Write(tenant, [], "never")

    def noting(label: str) -> Any:
        async def work(conn: Any) -> Write:
            return Write(tenant, [Event(type="test.noted", actor={"subject": "t"},
                                        payload={"label": label})], label)
        return work

    async def write_then_refuse(conn: Any) -> Write:
        await conn.execute(decisions.insert(), {**row, "id": "written-then-refused",
                                                 "request_id": "written-then-refused"})
        raise Conflict("refused after writing", code="test_refusal")

    writer = harness.context.log_writer
    outcomes = await asyncio.gather(
        writer.submit(noting("a")), writer.submit(duplicate),
        writer.submit(noting("b")), writer.submit(write_then_refuse),
        writer.submit(noting("c")), return_exceptions=True)
    assert isinstance(outcomes[1], UniqueViolation)
    assert isinstance(outcomes[3], Conflict) and outcomes[3].code == "test_refusal"
    assert [outcomes[i].result for i in (0, 2, 4)] == ["a", "b", "c"]
    async with harness.db.read() as conn:
        noted = (await conn.execute(select(audit_events.c.body).where(
            audit_events.c.tenant == tenant, audit_events.c.type == "test.noted"))
        ).scalars().all()
        stray = (await conn.execute(select(decisions.c.id).where(
            decisions.c.id == "written-then-refused"))).first()
    assert len(noted) == 3 and stray is None
