"""Decision-log tables added by the audit area (migration ``0003_audit``).

``audit_checkpoints``: one signed checkpoint ``{tenant, seq, hash, time}`` per row; the
compact JWS (``typ: cosigner-checkpoint+jwt``) is kept verbatim so exports can carry it.
Checkpoints are never pruned: the latest one at or below the oldest kept event is the
chain's anchor after retention.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, DateTime, PrimaryKeyConstraint, String, Table, Text

from cosigner.db.tables import metadata

audit_checkpoints = Table(
    "audit_checkpoints",
    metadata,
    Column("tenant", String(128), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("hash", String(71), nullable=False),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("kid", String(64), nullable=False),
    Column("token", Text, nullable=False),
    PrimaryKeyConstraint("tenant", "seq", name="pk_audit_checkpoints"),
)
