"""Core tables (SQLAlchemy Core). Other areas add tables to the same ``metadata`` in
``tables_<area>.py`` modules, each with its own Alembic migration branching from
``0001_core`` (the app upgrades to ``heads``).

Times are stored as timezone-aware UTC; JSON columns hold JSON values.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from cosigner.db.compressed import ResponseJSON
from cosigner.db.digest import Sha256Digest
from cosigner.db.event_row import EventBody
from cosigner.db.response_row import REF_COLUMNS
from cosigner.db.sqlite_compact import HexId, Instant, UuidText

metadata = MetaData()

principals = Table(
    "principals",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("tenant", String(128), nullable=False),
    # Canonical form (cosigner.core.subjects): the identity every other table records, and what
    # the unique key compares, so two spellings of one person can never both exist.
    Column("subject", String(256), nullable=False),
    Column("display_name", String(256), nullable=True),  # the spelling it was created with
    Column("kind", String(16), nullable=False),  # "key" | "user"
    Column("roles", JSON, nullable=False),
    Column("password_hash", Text, nullable=True),
    Column("disabled", Boolean, nullable=False, default=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    # Last successful interactive web sign-in (single sign-on or password; migration
    # 0018): a Slack click acts only while it is recent (settings.slack_signin_max_age_s).
    Column("last_signed_in_at", DateTime(timezone=True), nullable=True),
    UniqueConstraint("tenant", "subject", name="uq_principals_tenant_subject"),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", String(32), primary_key=True),  # public key id, part of the key string
    Column("principal_id", String(36), ForeignKey("principals.id"), nullable=False),
    Column("secret_hash", String(64), nullable=False),  # SHA-256 hex of the secret part
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
)

decisions = Table(
    "decisions",
    metadata,
    # Ids 16 bytes and instants 8 on SQLite (cosigner.db.sqlite_compact; 0021).
    Column("id", UuidText, primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("request_id", String(256), nullable=False),
    # "sha256:<hex>" texts stored as their 32 bytes (cosigner.db.digest; 0020).
    Column("request_hash", Sha256Digest, nullable=False),
    Column("run_id", String(256), nullable=False),
    Column("tool", String(256), nullable=False),
    Column("args_hash", Sha256Digest, nullable=False),
    Column("effect", String(32), nullable=False),
    Column("caller", String(256), nullable=False),
    Column("policy_id", String(128), nullable=True),
    Column("policy_version", String(64), nullable=True),
    Column("policy_revision", Sha256Digest, nullable=True),
    # The Decision v1 answer, zstd-compressed (cosigner.db.compressed; migration 0017),
    # its permit token stored decoded inside the same frame (0020_s5store_facts_once).
    Column("response", ResponseJSON, nullable=False),
    Column("created_at", Instant, nullable=False),
    UniqueConstraint("tenant", "request_id", name="uq_decisions_tenant_request"),
    Index("ix_decisions_run", "tenant", "run_id"),
)
#: ``decisions.response`` and the columns its stored forms 3 and 7 refer to
#: (:data:`cosigner.db.response_row.REF_COLUMNS`): what every reader of a stored answer
#: selects, so that :func:`cosigner.db.response_row.answer` can resolve it.
DECISION_ANSWER = (decisions.c.response, *(decisions.c[name] for name in REF_COLUMNS))

permits = Table(
    "permits",
    metadata,
    Column("jti", HexId, primary_key=True),  # 16 bytes on SQLite (0021)
    Column("tenant", String(128), nullable=False),
    Column("decision_id", UuidText, nullable=False),
    Column("approval_id", String(36), nullable=True),
    Column("run_id", String(256), nullable=False),
    Column("tool", String(256), nullable=False),
    Column("args_hash", Sha256Digest, nullable=False),  # its 32 bytes (0020)
    Column("status", String(16), nullable=False),  # issued | redeemed | revoked | expired
    Column("issued_at", Instant, nullable=False),
    Column("expires_at", Instant, nullable=False),
    Column("redeemed_at", Instant, nullable=True),
    Column("revoked_at", Instant, nullable=True),
    # permits.tokens.token_digest of the minted token (16 bytes): a redeem presenting
    # exactly this token skips the Ed25519 check (0025). NULL on rows minted before.
    Column("token_digest", LargeBinary(16), nullable=True),
    # Not WITHOUT ROWID: this index would then carry the 32-character jti instead of a
    # rowid, which costs more than the table's separate key index (measured: 377 vs 371
    # bytes per permit with indexes).
    Index("ix_permits_decision", "decision_id"),
)

audit_events = Table(
    "audit_events",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("tenant", String(128), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("type", String(64), nullable=False),
    Column("time", Instant, nullable=False),  # 8 bytes on SQLite (0021)
    Column("decision_id", UuidText, nullable=True),  # 16 bytes on SQLite (0021)
    Column("approval_id", String(36), nullable=True),
    Column("permit_jti", HexId, nullable=True),
    Column("run_id", String(256), nullable=True),
    Column("tool", String(256), nullable=True),
    Column("effect", String(32), nullable=True),
    Column("principal", String(256), nullable=True),
    Column("policy_id", String(128), nullable=True),
    Column("policy_version", String(64), nullable=True),
    Column("mode", String(16), nullable=True),  # "shadow" for shadow decisions (0011)
    # RFC 8785 canonical JSON of the event, zstd-compressed in storage (0017), its
    # prev_hash left to the row before and two events of one decision in one frame
    # (cosigner.db.event_row; 0023): reads give the exact text that was hashed.
    Column("body", EventBody, nullable=False),
    # "sha256:<hex>" stored as its 32 bytes (cosigner.db.digest; 0020_s5store_facts_once).
    Column("hash", Sha256Digest, nullable=False),
    UniqueConstraint("tenant", "seq", name="uq_audit_events_tenant_seq"),
    Index("ix_audit_events_decision", "tenant", "decision_id"),
    Index("ix_audit_events_time", "tenant", "time"),
)

audit_heads = Table(
    "audit_heads",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("hash", String(71), nullable=False),
)
