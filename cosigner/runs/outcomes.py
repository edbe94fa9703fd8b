"""Outcome reports: the third gate, what happened after a decision (DESIGN § gates).

``outcome`` is ``ok | error | timeout``; ``side_effect`` is ``none | committed |
not_executed | unknown``; ``cost_minor`` (optional, minor units) is counted against the
run contract's budget. One report per decision: an identical second report answers the
first (idempotent retry), any other is :class:`~cosigner.core.errors.OutcomeConflict` (409).
The report, its ``outcome.reported`` event and the cost commit together.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.audit.chain import Event, append
from cosigner.core.clock import isoformat
from cosigner.core.errors import NotFound, OutcomeConflict
from cosigner.db.database import Database, UniqueViolation
from cosigner.db.tables import decisions
from cosigner.db.tables_runs import decision_outcomes
from cosigner.identity.principals import Caller
from cosigner.runs import contracts

OUTCOMES = frozenset({"ok", "error", "timeout"})
SIDE_EFFECTS = frozenset({"none", "committed", "not_executed", "unknown"})


def _as_dict(row: Any) -> dict[str, Any]:
    at = row.reported_at if row.reported_at.tzinfo else row.reported_at.replace(tzinfo=UTC)
    return {"decision_id": row.decision_id, "run_id": row.run_id, "outcome": row.outcome,
            "side_effect": row.side_effect, "cost_minor": row.cost_minor,
            "reported_at": isoformat(at)}


def _same(row: Any, outcome: str, side_effect: str, cost_minor: int | None) -> bool:
    return (row.outcome, row.side_effect, row.cost_minor) == (outcome, side_effect, cost_minor)


async def _existing(conn: AsyncConnection, tenant: str, decision_id: str) -> Any:
    return (await conn.execute(select(decision_outcomes).where(
        decision_outcomes.c.tenant == tenant,
        decision_outcomes.c.decision_id == decision_id))).first()


async def report_outcome(db: Database, caller: Caller, *, decision_id: str, outcome: str,
                         side_effect: str, cost_minor: int | None,
                         now: datetime) -> dict[str, Any]:
    """Record the outcome of decision ``decision_id`` of the caller's tenant.

    Returns the Outcome v1 object. Raises :class:`NotFound` (404; also for another
    tenant's decision), :class:`OutcomeConflict` (409, a different report exists),
    ``Unavailable`` (503).
    """
    assert outcome in OUTCOMES and side_effect in SIDE_EFFECTS  # the wire model checked
    tenant = caller.tenant
    try:
        async with db.transaction() as conn:
            decision = (await conn.execute(
                select(decisions.c.run_id, decisions.c.tool, decisions.c.args_hash).where(
                    decisions.c.tenant == tenant, decisions.c.id == decision_id))).first()
            if decision is None:
                raise NotFound("no such decision in this tenant")
            row = await _existing(conn, tenant, decision_id)
            if row is not None:
                if not _same(row, outcome, side_effect, cost_minor):
                    raise OutcomeConflict("a different outcome was already reported")
                return _as_dict(row)
            values = {"decision_id": decision_id, "tenant": tenant,
                      "run_id": decision.run_id, "outcome": outcome,
                      "side_effect": side_effect, "cost_minor": cost_minor,
                      "reported_by": caller.subject, "reported_at": now}
            await conn.execute(decision_outcomes.insert().values(**values))
            if cost_minor:
                await contracts.add_cost(conn, tenant=tenant, run_id=decision.run_id,
                                         cost_minor=cost_minor, now=now)
            await append(conn, tenant, [Event(
                type="outcome.reported",
                actor={"subject": caller.subject, "principal_id": caller.principal_id,
                       "kind": caller.kind},
                decision_id=decision_id, run_id=decision.run_id, tool=decision.tool,
                args_hash=decision.args_hash,
                payload={"outcome": outcome, "side_effect": side_effect,
                         "cost_minor": cost_minor})], now=now)
    except UniqueViolation:
        # A concurrent report won the insert: identical → answer with it, else conflict.
        async with db.read() as conn:
            row = await _existing(conn, tenant, decision_id)
        if row is None or not _same(row, outcome, side_effect, cost_minor):
            raise OutcomeConflict("a different outcome was already reported") from None
        return _as_dict(row)
    return {"decision_id": decision_id, "run_id": decision.run_id, "outcome": outcome,
            "side_effect": side_effect, "cost_minor": cost_minor,
            "reported_at": isoformat(now)}
