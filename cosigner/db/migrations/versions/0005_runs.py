"""run contracts and outcome reports

Revision ID: 0005_runs
Revises: 0001_core
Create Date: 2026-12-01 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_runs"
down_revision: str | Sequence[str] | None = "0001_core"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("run_id", sa.String(length=256), nullable=False),
        sa.Column("contract", sa.JSON(), nullable=False),
        sa.Column("contract_hash", sa.String(length=71), nullable=False),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("tool_calls", sa.Integer(), nullable=False),
        sa.Column("cost_minor", sa.BigInteger(), nullable=False),
        sa.Column("tool_counts", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=256), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "run_id"),
    )
    op.create_table(
        "decision_outcomes",
        sa.Column("decision_id", sa.String(length=36), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("run_id", sa.String(length=256), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("side_effect", sa.String(length=16), nullable=False),
        sa.Column("cost_minor", sa.BigInteger(), nullable=True),
        sa.Column("reported_by", sa.String(length=256), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("decision_id"),
    )


def downgrade() -> None:
    op.drop_table("decision_outcomes")
    op.drop_table("runs")
