"""Policy state (issue 13): which version of each bundle is active and which is shadow.

One row per bundle id, shared by every replica: a process reads it at start and follows
it (``generation`` grows by one on every change of the row), so an activation on one
replica is used by all, and a restart keeps what was active. Bundle files stay on disk;
only the choice of version lives here.
"""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Column, DateTime, String, Table

from cosigner.db.tables import metadata

policy_state = Table(
    "policy_state",
    metadata,
    Column("bundle_id", String(128), primary_key=True),
    Column("active_version", String(64), nullable=False),
    Column("active_revision", String(71), nullable=False),  # at activation, for the record
    Column("active_tenants", JSON, nullable=False),  # its manifest tenants, for fail-closed
    Column("shadow_version", String(64), nullable=True),
    Column("generation", BigInteger, nullable=False),
    Column("changed_at", DateTime(timezone=True), nullable=False),
    Column("changed_by", JSON, nullable=False),  # the actor {tenant, subject, ...}
)
