"""Tables of the approver web form and its notifications (migration ``0004_web``).

* ``web_sessions``: server-side sign-in sessions. Only SHA-256 of the opaque session id is
  stored, so a copy of the database does not let anyone sign in.
  ``auth_method``/``acr``/``amr``/``auth_time`` record how the person signed in
  (:class:`cosigner.identity.principals.Authn`; migration ``0013_oidc``).
* ``oidc_logins``: single sign-ons started and not yet finished: SHA-256 of the ``state``
  (the lookup key, single use), SHA-256 of the browser-binding cookie, the ``nonce`` and the
  PKCE code verifier, where to go afterwards, when the sign-in expires, and the client
  address that started it (at most ``settings.oidc_pending_per_address_max`` live ones each).
* ``signin_failures``: failed sign-in counters per account and per address, in the database so
  every replica sees the same counts.
* ``webhook_deliveries`` / ``webhook_attempts``: the notification outbox (written in the same
  transaction as the approval event) and one row per delivery attempt.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
)

from cosigner.db.tables import metadata

web_sessions = Table(
    "web_sessions",
    metadata,
    Column("id_hash", String(64), primary_key=True),  # SHA-256 hex of the cookie value
    Column("principal_id", String(36), ForeignKey("principals.id"), nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("last_seen_at", DateTime(timezone=True), nullable=False),
    Column("auth_method", String(16), nullable=False, server_default="password"),
    Column("acr", String(256), nullable=True),
    Column("amr", JSON, nullable=True),
    Column("auth_time", BigInteger, nullable=True),  # seconds since the epoch
    Index("ix_web_sessions_principal", "principal_id"),
)

oidc_logins = Table(
    "oidc_logins",
    metadata,
    Column("state_hash", String(64), primary_key=True),
    Column("browser_hash", String(64), nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("nonce", String(128), nullable=False),
    Column("code_verifier", String(128), nullable=False),
    Column("next_path", String(512), nullable=False),
    Column("step_up", JSON, nullable=True),  # {acr_values, max_age} asked for, or null
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    # Who started it (oidc_signin.address_key; migration 0019): bounds unfinished ones.
    Column("address", String(64), nullable=True),
    Index("ix_oidc_logins_expires", "expires_at"),
    Index("ix_oidc_logins_address", "address", "expires_at"),
)

signin_failures = Table(
    "signin_failures",
    metadata,
    Column("key", String(512), primary_key=True),  # "account:<tenant>/<name>" | "address:<ip>"
    Column("failures", Integer, nullable=False),
    Column("window_start", DateTime(timezone=True), nullable=False),
    Column("locked_until", DateTime(timezone=True), nullable=True),
)

webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("event_type", String(64), nullable=False),  # approval.pending | approval.decided
    Column("url", Text, nullable=False),
    Column("body", Text, nullable=False),  # the exact JSON bytes that are signed and sent
    Column("status", String(16), nullable=False),  # pending | delivered | failed
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False),
    Column("claimed_until", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("delivered_at", DateTime(timezone=True), nullable=True),
    Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
)

webhook_attempts = Table(
    "webhook_attempts",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("delivery_id", String(36), ForeignKey("webhook_deliveries.id"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("status_code", Integer, nullable=True),
    Column("error", String(500), nullable=True),
    Column("duration_ms", Integer, nullable=False),
    Index("ix_webhook_attempts_delivery", "delivery_id"),
)
