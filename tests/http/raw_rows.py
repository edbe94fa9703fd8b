"""What a decision wrote, read back for comparing the raw driver's way with SQLAlchemy's
(tests/http/test_raw_batches.py, tests/http/test_raw_join.py)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from cosigner.audit.chain import verify_bodies
from cosigner.db import response_row
from cosigner.db.tables import audit_events, decisions
from cosigner.db.tables_approvals import approvals, call_inputs
from tests.conftest import Harness

#: Members that differ between two decisions of the same call (ids, times, the run).
VARYING = {"id", "decision_id", "request_id", "approval_id", "run_id", "created_at",
           "expires_at", "review_url", "time", "seq", "prev_hash", "hash", "run", "subject",
           "trace_id", "eval_us", "permit_jti", "request_hash"}


def same(value: Any) -> Any:
    """``value`` without the members that differ between two decisions."""
    if isinstance(value, dict):
        return {k: same(v) for k, v in value.items() if k not in VARYING}
    if isinstance(value, list):
        return [same(v) for v in value]
    return value


async def written(h: Harness, tenant: str, decision_id: str) -> dict[str, Any]:
    """Decision ``decision_id``'s rows and events, without their :data:`VARYING` members:
    its ``decisions`` row (the answer decoded), the approval requests it opened, its
    stored call input and its log events in chain order."""
    async with h.db.read() as conn:
        decision = (await conn.execute(select(decisions).where(
            decisions.c.tenant == tenant, decisions.c.id == decision_id))).one()
        opened = (await conn.execute(select(approvals).where(
            approvals.c.tenant == tenant, approvals.c.decision_id == decision_id))).all()
        stored = (await conn.execute(select(call_inputs.c.input, call_inputs.c.mask).where(
            call_inputs.c.tenant == tenant,
            call_inputs.c.decision_id == decision_id))).one()
        events = (await conn.execute(select(audit_events.c.type, audit_events.c.body).where(
            audit_events.c.tenant == tenant, audit_events.c.decision_id == decision_id)
            .order_by(audit_events.c.seq))).all()
    return {"decision": same({**decision._mapping, "response": response_row.answer(decision)}),
            "approvals": [same(dict(row._mapping)) for row in opened],
            "input": same(stored.input), "mask": stored.mask,
            "events": [(e.type, same(json.loads(e.body))) for e in events]}


async def last_events(h: Harness, tenant: str, count: int) -> list[tuple[str, Any]]:
    """``tenant``'s last ``count`` log events in chain order, as ``(type, body without its
    VARYING members)`` (an ``approval.joined`` names the request's opening decision, so
    reading by decision id misses it)."""
    async with h.db.read() as conn:
        rows = (await conn.execute(select(audit_events.c.type, audit_events.c.body).where(
            audit_events.c.tenant == tenant).order_by(audit_events.c.seq.desc())
            .limit(count))).all()
    return [(e.type, same(json.loads(e.body))) for e in reversed(rows)]


async def chain_holds(h: Harness, tenant: str) -> None:
    """``tenant``'s decision log verifies from its first event (hash chain, order)."""
    async with h.db.read() as conn:
        rows = (await conn.execute(select(audit_events.c.body, audit_events.c.hash)
                                   .where(audit_events.c.tenant == tenant)
                                   .order_by(audit_events.c.seq))).all()
    assert verify_bodies([(r.body, r.hash) for r in rows]) == (None, None)
