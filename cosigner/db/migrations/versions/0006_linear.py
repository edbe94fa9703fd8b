"""join the four area branches into one line of history

Revision ID: 0006_linear
Revises: 0002_approvals, 0003_audit, 0004_web, 0005_runs
Create Date: 2026-12-01 02:10:00

From here on the history is linear: every later revision names exactly one parent, and
``alembic heads`` shows one head. Databases made before this revision carry four rows in
``alembic_version``; upgrading through this merge point collapses them into one.
"""

from collections.abc import Sequence

revision: str = "0006_linear"
down_revision: str | Sequence[str] | None = (
    "0002_approvals", "0003_audit", "0004_web", "0005_runs")
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
