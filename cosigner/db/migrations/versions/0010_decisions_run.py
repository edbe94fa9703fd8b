"""decisions by run: an index so registering a run contract can ask "has this run started?"

Revision ID: 0010_decisions_run
Revises: 0009_policy_state
Create Date: 2026-12-01 03:10:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010_decisions_run"
down_revision: str | Sequence[str] | None = "0009_policy_state"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_decisions_run", "decisions", ["tenant", "run_id"])


def downgrade() -> None:
    op.drop_index("ix_decisions_run", table_name="decisions")
