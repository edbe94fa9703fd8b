"""policy state: active and shadow version per bundle, shared by every replica

Revision ID: 0009_policy_state
Revises: 0008_signing_keys
Create Date: 2026-12-01 03:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_policy_state"
down_revision: str | Sequence[str] | None = "0008_signing_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "policy_state",
        sa.Column("bundle_id", sa.String(length=128), nullable=False),
        sa.Column("active_version", sa.String(length=64), nullable=False),
        sa.Column("active_revision", sa.String(length=71), nullable=False),
        sa.Column("active_tenants", sa.JSON(), nullable=False),
        sa.Column("shadow_version", sa.String(length=64), nullable=True),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("changed_by", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("bundle_id"),
    )


def downgrade() -> None:
    op.drop_table("policy_state")
