"""What a run already did: its decisions with their outcomes, for the approver's run panel.

Read from the decision records of one ``(tenant, run)``: the ``decisions`` table (effect,
tool, args hash, time), each decision's ``decision.made`` event in the decision log (the
arguments **as logged**, i.e. already masked by :func:`cosigner.audit.chain.append`, and
masked again by :func:`cosigner.audit.masking.mask_value` for the always-secret keys), the
outcome report (``decision_outcomes``), the permit's state and the approval request's
status. Bounded: the latest ``limit`` decisions, with the run's total count.

A ``decision.made`` event that does not read back (rows deleted or damaged outside
Cosigner: :class:`~cosigner.db.event_row.EventUnreadable`) is left out with a logged
warning: its entry is still listed, from the ``decisions`` table, with ``args`` ``None``
as when the log holds no arguments. The panel is information for the approver, never the
authority for anything (the approval request shows its own arguments).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select

from cosigner.audit.masking import mask_value
from cosigner.core.clock import isoformat
from cosigner.db import event_row, response_row
from cosigner.db.database import Database
from cosigner.db.tables import DECISION_ANSWER, audit_events, decisions, permits
from cosigner.db.tables_approvals import approvals
from cosigner.db.tables_runs import decision_outcomes

#: Most decisions one panel shows (the latest ones).
MAX_ENTRIES = 50
#: Each event body, or a marker when it does not read (left out, logged).
_BODY = event_row.lenient(audit_events.c.body)


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _permit_state(row: Any, now: datetime) -> str:
    if row.status == "issued" and now >= _utc(row.expires_at):
        return "expired"
    return str(row.status)


async def run_timeline(db: Database, *, tenant: str, run_id: str, now: datetime,
                       limit: int = 20) -> dict[str, Any]:
    """The latest ``limit`` (≤ :data:`MAX_ENTRIES`) decisions of run ``run_id`` in
    ``tenant``, oldest first, and ``total``, the run's count of decisions.

    Each entry: ``{decision_id, at (RFC 3339 UTC), tool, effect, reasons: [code], args
    (masked, or None when the log holds none), args_hash, mode (None | "shadow"),
    approval: {id, status} | None, permit_status: issued|redeemed|revoked|expired | None,
    outcome: {outcome, side_effect, cost_minor (minor units)} | None}``. ``args`` is also
    ``None`` when the decision's event does not read back (module docstring).
    """
    limit = max(1, min(limit, MAX_ENTRIES))
    where = (decisions.c.tenant == tenant, decisions.c.run_id == run_id)
    async with db.read() as conn:
        total = int((await conn.execute(
            select(func.count()).select_from(decisions).where(*where))).scalar_one())
        rows = (await conn.execute(
            select(decisions.c.tool, decisions.c.effect, decisions.c.created_at,
                   *DECISION_ANSWER)
            .where(*where).order_by(decisions.c.created_at.desc(), decisions.c.id.desc())
            .limit(limit))).all()
        ids = [row.id for row in rows]
        if not ids:
            return {"entries": [], "total": total}
        bodies = {r.decision_id: body for r in (await conn.execute(
            select(audit_events.c.decision_id, audit_events.c.seq, _BODY).where(
                audit_events.c.tenant == tenant, audit_events.c.decision_id.in_(ids),
                audit_events.c.type == "decision.made"))).all()
            if (body := event_row.readable(r.body, tenant=tenant, seq=int(r.seq),
                                           reader="the run panel")) is not None}
        outcomes = {r.decision_id: r for r in (await conn.execute(
            select(decision_outcomes).where(decision_outcomes.c.tenant == tenant,
                                            decision_outcomes.c.decision_id.in_(ids)))).all()}
        ledger = {r.decision_id: r for r in (await conn.execute(
            select(permits).where(permits.c.tenant == tenant,
                                  permits.c.decision_id.in_(ids)))).all()}
        requests = {r.decision_id: r for r in (await conn.execute(
            select(approvals.c.id, approvals.c.decision_id, approvals.c.status,
                   approvals.c.expires_at).where(approvals.c.tenant == tenant,
                                                 approvals.c.decision_id.in_(ids)))).all()}
    entries = []
    for row in reversed(rows):
        payload = bodies[row.id].get("payload", {}) if row.id in bodies else {}
        answer = response_row.answer(row)
        response = answer if isinstance(answer, dict) else {}
        request = requests.get(row.id)
        outcome = outcomes.get(row.id)
        status = None
        if request is not None:
            status = request.status
            if status == "pending" and now >= _utc(request.expires_at):
                status = "expired"
        entries.append({
            "decision_id": row.id,
            "at": isoformat(_utc(row.created_at)),
            "tool": row.tool,
            "effect": row.effect,
            "reasons": [r.get("code") if isinstance(r, dict) else str(r)
                        for r in response.get("reasons", [])],
            "args": mask_value(payload["args"], []) if "args" in payload else None,
            "args_hash": row.args_hash,
            "mode": response.get("mode"),
            "approval": None if request is None else {"id": request.id, "status": status},
            "permit_status": (_permit_state(ledger[row.id], now) if row.id in ledger
                              else None),
            "outcome": None if outcome is None else {
                "outcome": outcome.outcome, "side_effect": outcome.side_effect,
                "cost_minor": outcome.cost_minor},
        })
    return {"entries": entries, "total": total}
