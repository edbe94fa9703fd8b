"""Tables of run contracts and outcome reports (issue 7).

``runs`` holds one contract per ``(tenant, run_id)`` with its live counters, updated in
the same transaction as each decision of the run. ``decision_outcomes`` holds the one
outcome report per decision. Money is in minor units (integers).
"""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Column, DateTime, Integer, String, Table

from cosigner.db.sqlite_compact import UuidText
from cosigner.db.tables import metadata

runs = Table(
    "runs",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("run_id", String(256), primary_key=True),
    Column("contract", JSON, nullable=False),  # the registered contract, as sent (validated)
    Column("contract_hash", String(71), nullable=False),  # sha256 of its RFC 8785 form
    Column("deadline", DateTime(timezone=True), nullable=True),
    Column("tool_calls", Integer, nullable=False),
    Column("cost_minor", BigInteger, nullable=False),
    Column("tool_counts", JSON, nullable=False),  # {tool name: calls counted}
    Column("created_by", String(256), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

decision_outcomes = Table(
    "decision_outcomes",
    metadata,
    Column("decision_id", UuidText, primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("run_id", String(256), nullable=False),
    Column("outcome", String(16), nullable=False),  # ok | error | timeout
    Column("side_effect", String(16), nullable=False),  # none|committed|not_executed|unknown
    Column("cost_minor", BigInteger, nullable=True),
    Column("reported_by", String(256), nullable=False),
    Column("reported_at", DateTime(timezone=True), nullable=False),
)
