"""approvals, reviews and stored call inputs

Revision ID: 0002_approvals
Revises: 0001_core
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_approvals"
down_revision: str | Sequence[str] | None = "0001_core"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PENDING = sa.text("status = 'pending'")


def upgrade() -> None:
    op.create_table(
        "approvals",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("decision_id", sa.String(36), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("tool", sa.String(256), nullable=False),
        sa.Column("args_hash", sa.String(71), nullable=False),
        sa.Column("args", sa.Text(), nullable=False),
        sa.Column("mask", sa.JSON(), nullable=False),
        sa.Column("requirement", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("initiator", sa.JSON(), nullable=False),
        sa.Column("principal", sa.JSON(), nullable=False),
        sa.Column("opened_by", sa.JSON(), nullable=False),
        sa.Column("reasons", sa.JSON(), nullable=False),
        sa.Column("policy", sa.JSON(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("permit_jti", sa.String(64), nullable=True),
        sa.Column("permit", sa.JSON(), nullable=True),
    )
    op.create_index("uq_approvals_pending_call", "approvals",
                    ["tenant", "run_id", "tool", "args_hash"], unique=True,
                    sqlite_where=_PENDING, postgresql_where=_PENDING)
    op.create_index("ix_approvals_tenant_status", "approvals",
                    ["tenant", "status", "expires_at"])
    op.create_index("ix_approvals_decision", "approvals", ["tenant", "decision_id"])
    op.create_table(
        "reviews",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("approval_id", sa.String(36), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("principal_id", sa.String(36), nullable=False),
        sa.Column("roles", sa.JSON(), nullable=False),
        sa.Column("role", sa.String(64), nullable=True),
        sa.Column("decision", sa.String(16), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("approval_id", "subject", name="uq_reviews_approval_subject"),
    )
    op.create_index("ix_reviews_run", "reviews", ["tenant", "run_id", "decision"])
    op.create_table(
        "call_inputs",
        sa.Column("decision_id", sa.String(36), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("input", sa.JSON(), nullable=False),
        sa.Column("mask", sa.JSON(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("call_inputs")
    op.drop_index("ix_reviews_run", table_name="reviews")
    op.drop_table("reviews")
    op.drop_index("ix_approvals_decision", table_name="approvals")
    op.drop_index("ix_approvals_tenant_status", table_name="approvals")
    op.drop_index("uq_approvals_pending_call", table_name="approvals")
    op.drop_table("approvals")
