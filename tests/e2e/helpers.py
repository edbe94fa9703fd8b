"""Shared pieces of the end-to-end tests: keys, HTTP clients, reading the decision log."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import select

from cosigner.audit.chain import verify_bodies
from cosigner.core.clock import system_clock
from cosigner.db.database import Database
from cosigner.db.tables import audit_events, permits
from cosigner.identity.principals import create_api_key
from tests.conftest import ROOT

REFUND_ARGS = {"order_id": "ord_8472", "currency": "USD", "reason_code": "duplicate_charge"}
#: Only the Python refund bundle: a restart then skips compiling and testing the Rego ones.
PYTHON_BUNDLES = json.dumps([str(ROOT / "policies")])
#: Amounts the reference refund policy answers with allow / require_approval / deny.
AMOUNT = {"allow": 5_000, "require_approval": 150_000, "deny": 250_000}


async def make_keys(database_url: str, tenant: str,
                    specs: dict[str, tuple[list[str], str]]) -> dict[str, str]:
    """``{name: (roles, subject)}`` → ``{name: "Bearer …" header value}``."""
    db = Database(database_url)
    try:
        out = {}
        for name, (roles, subject) in specs.items():
            key, _ = await create_api_key(db, tenant=tenant, roles=roles, subject=subject,
                                          clock=system_clock)
            out[name] = f"Bearer {key}"
        return out
    finally:
        await db.dispose()


def client(base_url: str, *, connections: int = 100, timeout_s: float = 60
           ) -> httpx.AsyncClient:
    """An HTTP client for a burst: ``connections`` requests in flight at once (the rest of a
    ``gather`` queue in the client), idle connections dropped before uvicorn's 5 s
    keep-alive closes them under our feet."""
    return httpx.AsyncClient(
        base_url=base_url, timeout=timeout_s,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections,
                            keepalive_expiry=1.0))


def refund(amount: int, *, run: str | None = None, request_id: str | None = None
           ) -> dict[str, Any]:
    """A DecisionRequest for the reference refund policy."""
    return {
        "request_id": request_id or f"req-{uuid.uuid4().hex}",
        "run": {"id": run or f"run-{uuid.uuid4().hex[:10]}"},
        "principal": {"id": "customer-42", "type": "customer"},
        "initiator": {"id": "agent-support", "type": "agent"},
        "tool": {"name": "issue_refund", "side_effect": "financial"},
        "args": {**REFUND_ARGS, "amount_minor": amount},
        "context": {},
    }


@dataclass
class Log:
    """One tenant's decision log and permit rows, read straight from the database."""

    events: list[Any]
    permit_rows: list[Any]

    def of_type(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.type == kind]

    def chain_fault(self) -> tuple[int | None, str | None]:
        return verify_bodies([(e.body, e.hash) for e in self.events])

    def assert_consistent(self) -> None:
        """Linear chain, unique decision ids, no permit redeemed twice, rows agree."""
        seqs = [e.seq for e in self.events]
        assert seqs == list(range(1, len(seqs) + 1)), "chain seq is not 1..n"
        assert self.chain_fault() == (None, None)
        made = [e.decision_id for e in self.of_type("decision.made")]
        assert len(made) == len(set(made)), "a decision.made event is duplicated"
        request_ids = [json.loads(e.body)["payload"]["request_id"]
                       for e in self.of_type("decision.made")]
        assert len(request_ids) == len(set(request_ids)), "one request_id decided twice"
        redeemed = Counter(e.permit_jti for e in self.of_type("permit.redeemed"))
        assert not [j for j, n in redeemed.items() if n > 1], "a permit was redeemed twice"
        minted = Counter(e.permit_jti for e in self.of_type("permit.minted"))
        assert not [j for j, n in minted.items() if n > 1], "a permit was minted twice"
        rows = {r.jti: r for r in self.permit_rows}
        assert set(rows) == set(minted), "permit rows and permit.minted events differ"
        assert {j for j, r in rows.items() if r.status == "redeemed"} == set(redeemed)


async def read_log(database_url: str, tenant: str) -> Log:
    db = Database(database_url)
    try:
        async with db.read() as conn:
            events = (await conn.execute(
                select(audit_events.c.seq, audit_events.c.type, audit_events.c.decision_id,
                       audit_events.c.approval_id, audit_events.c.permit_jti,
                       audit_events.c.effect, audit_events.c.body, audit_events.c.hash)
                .where(audit_events.c.tenant == tenant).order_by(audit_events.c.seq))).all()
            rows = (await conn.execute(select(permits).where(permits.c.tenant == tenant))).all()
        return Log(list(events), list(rows))
    finally:
        await db.dispose()
