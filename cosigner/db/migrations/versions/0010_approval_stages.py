"""approval stages: escalation on expiry (stage of a request and of each review);
break-glass and its after-the-fact review; bounded standing approvals

Revision ID: 0010_approval_stages
Revises: 0009_policy_state
Create Date: 2026-12-01 03:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_approval_stages"
down_revision: str | Sequence[str] | None = "0009_policy_state"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN (a constant default): SQLite keeps the partial indexes untouched.
    for table in ("approvals", "reviews"):
        op.add_column(table, sa.Column("stage", sa.Integer(), nullable=False,
                                       server_default=sa.text("1")))
    op.add_column("approvals", sa.Column("break_glass", sa.JSON(), nullable=True))
    op.add_column("approvals", sa.Column("after_review", sa.String(8), nullable=True))
    op.add_column("approvals", sa.Column("after_reviewed", sa.JSON(), nullable=True))
    op.create_index("ix_approvals_after_review", "approvals", ["tenant", "after_review"])
    op.create_table(
        "standing_approvals",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("approval_id", sa.String(36), nullable=False),
        sa.Column("tool", sa.String(256), nullable=False),
        sa.Column("principal_id", sa.String(256), nullable=False),
        sa.Column("run_id", sa.String(256), nullable=True),
        sa.Column("constraints", sa.JSON(), nullable=False),
        sa.Column("roles", sa.JSON(), nullable=False),
        sa.Column("max_uses", sa.Integer(), nullable=False),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_by", sa.JSON(), nullable=True),
    )
    op.create_index("ix_standing_call", "standing_approvals",
                    ["tenant", "tool", "principal_id"])


def downgrade() -> None:
    op.drop_index("ix_standing_call", table_name="standing_approvals")
    op.drop_table("standing_approvals")
    op.drop_index("ix_approvals_after_review", table_name="approvals")
    with op.batch_alter_table("approvals") as batch:
        for column in ("after_reviewed", "after_review", "break_glass"):
            batch.drop_column(column)
    for table in ("reviews", "approvals"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("stage")
