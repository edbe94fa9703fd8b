"""approver passkeys (WebAuthn): credentials, challenges, signed reviews

Revision ID: 0016_webauthn
Revises: 0015_pages
Create Date: 2026-12-01 05:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_webauthn"
down_revision: str | Sequence[str] | None = "0015_pages"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "webauthn_credentials",
        sa.Column("id", sa.String(length=36), primary_key=True),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("credential_id", sa.String(length=1400), nullable=False),
        sa.Column("principal_id", sa.String(length=36), nullable=False),
        sa.Column("subject", sa.String(length=256), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("alg", sa.Integer(), nullable=False),
        sa.Column("sign_count", sa.BigInteger(), nullable=False),
        sa.Column("aaguid", sa.String(length=36), nullable=False),
        sa.Column("fmt", sa.String(length=32), nullable=False),
        sa.Column("attestation_object", sa.Text(), nullable=False),
        sa.Column("user_verified", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("removed_by", sa.String(length=256), nullable=True),
        sa.UniqueConstraint("tenant", "credential_id", name="uq_webauthn_credentials_id"),
    )
    op.create_index("ix_webauthn_credentials_subject", "webauthn_credentials",
                    ["tenant", "subject"])
    op.create_table(
        "webauthn_challenges",
        sa.Column("id", sa.String(length=36), primary_key=True),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("principal_id", sa.String(length=36), nullable=False),
        sa.Column("subject", sa.String(length=256), nullable=False),
        sa.Column("purpose", sa.String(length=16), nullable=False),
        sa.Column("challenge", sa.String(length=128), nullable=False),
        sa.Column("approval_id", sa.String(length=36), nullable=True),
        sa.Column("decision", sa.String(length=16), nullable=True),
        sa.Column("statement", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("tenant", "challenge", name="uq_webauthn_challenges_challenge"),
    )
    op.create_index("ix_webauthn_challenges_expires", "webauthn_challenges", ["expires_at"])
    with op.batch_alter_table("reviews") as batch:
        batch.add_column(sa.Column("signature", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reviews") as batch:
        batch.drop_column("signature")
    op.drop_index("ix_webauthn_challenges_expires", table_name="webauthn_challenges")
    op.drop_table("webauthn_challenges")
    op.drop_index("ix_webauthn_credentials_subject", table_name="webauthn_credentials")
    op.drop_table("webauthn_credentials")
