"""shadow-mode decisions: audit_events.mode (issue 18)

Revision ID: 0011_barriers
Revises: 0010_approval_stages
Create Date: 2026-12-01 03:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_barriers"
down_revision: str | Sequence[str] | None = "0010_approval_stages"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A plain ADD COLUMN (SQLite supports it): no table copy, triggers kept.
    op.add_column("audit_events", sa.Column("mode", sa.String(length=16), nullable=True))


def downgrade() -> None:
    op.drop_column("audit_events", "mode")
