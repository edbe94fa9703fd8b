"""Tables of approver passkeys (WebAuthn) and their challenges (migration ``0016_webauthn``).

* ``webauthn_credentials``: one row per registered credential of a person (a principal of
  one tenant): its COSE public key, sign counter and attestation. A removed credential keeps
  its row (``removed_at``), so old signatures still name a known key.
* ``webauthn_challenges``: registration and signed-review challenges, stored server-side so
  any replica can finish a ceremony another began; single use (``used_at``) and short-lived
  (``expires_at``).
* ``reviews.signature`` (on the approvals table): the verified assertion of a signed review.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from cosigner.db.tables import metadata

webauthn_credentials = Table(
    "webauthn_credentials",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("credential_id", String(1400), nullable=False),  # base64url, <= 1023 bytes
    Column("principal_id", String(36), nullable=False),
    Column("subject", String(256), nullable=False),  # canonical subject of the person
    Column("name", String(100), nullable=False),
    Column("public_key", Text, nullable=False),  # COSE_Key, base64url
    Column("alg", Integer, nullable=False),  # COSE algorithm (-7 ES256, -8 EdDSA, -257 RS256)
    Column("sign_count", BigInteger, nullable=False),
    Column("aaguid", String(36), nullable=False),
    Column("fmt", String(32), nullable=False),  # attestation statement format
    Column("attestation_object", Text, nullable=False),  # base64url, as received
    Column("user_verified", Boolean, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("last_used_at", DateTime(timezone=True), nullable=True),
    Column("removed_at", DateTime(timezone=True), nullable=True),
    Column("removed_by", String(256), nullable=True),
    UniqueConstraint("tenant", "credential_id", name="uq_webauthn_credentials_id"),
    Index("ix_webauthn_credentials_subject", "tenant", "subject"),
)

webauthn_challenges = Table(
    "webauthn_challenges",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("principal_id", String(36), nullable=False),
    Column("subject", String(256), nullable=False),
    Column("purpose", String(16), nullable=False),  # register | review
    Column("challenge", String(128), nullable=False),  # base64url of the challenge bytes
    Column("approval_id", String(36), nullable=True),  # review only
    Column("decision", String(16), nullable=True),  # review only: approved | rejected
    Column("statement", JSON, nullable=True),  # review only: the statement signed
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("used_at", DateTime(timezone=True), nullable=True),
    UniqueConstraint("tenant", "challenge", name="uq_webauthn_challenges_challenge"),
    Index("ix_webauthn_challenges_expires", "expires_at"),
)
