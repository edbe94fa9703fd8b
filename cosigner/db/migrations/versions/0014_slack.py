"""Slack approvals: posted messages (their outbox), one-time link tokens, user links

Revision ID: 0014_slack
Revises: 0013_oidc
Create Date: 2026-12-01 05:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_slack"
down_revision: str | Sequence[str] | None = "0013_oidc"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "slack_messages",
        sa.Column("approval_id", sa.String(length=36), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("channel", sa.String(length=80), nullable=True),
        sa.Column("ts", sa.String(length=32), nullable=True),
        sa.Column("shown_status", sa.String(length=16), nullable=True),
        sa.Column("shown_stage", sa.Integer(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("approval_id"),
    )
    op.create_index("ix_slack_messages_state", "slack_messages", ["state", "next_attempt_at"])
    op.create_table(
        "slack_link_tokens",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("user_name", sa.String(length=256), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("token_hash"),
    )
    op.create_table(
        "slack_links",
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("user_name", sa.String(length=256), nullable=True),
        sa.Column("principal_id", sa.String(length=36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["principal_id"], ["principals.id"]),
        sa.PrimaryKeyConstraint("tenant", "team_id", "user_id"),
    )
    op.create_index("ix_slack_links_principal", "slack_links", ["principal_id"])


def downgrade() -> None:
    op.drop_index("ix_slack_links_principal", table_name="slack_links")
    op.drop_table("slack_links")
    op.drop_table("slack_link_tokens")
    op.drop_index("ix_slack_messages_state", table_name="slack_messages")
    op.drop_table("slack_messages")
