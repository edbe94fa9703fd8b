"""sign-in freshness: when each principal last signed in interactively

``principals.last_signed_in_at`` (UTC, nullable) is set at every successful web sign-in
(single sign-on and password). A Slack click acts only for a principal whose last
sign-in is younger than ``settings.slack_signin_max_age_s`` (README § Slack approvals), so
the roles a provider gave are confirmed there again. Existing rows stay ``NULL``: their
Slack links count as stale until the person signs in once.

Revision ID: 0018_signin_freshness
Revises: 0017_lean_storage
Create Date: 2026-12-01 06:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_signin_freshness"
down_revision: str | Sequence[str] | None = "0017_lean_storage"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("principals") as batch:
        batch.add_column(sa.Column("last_signed_in_at", sa.DateTime(timezone=True),
                                   nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("principals") as batch:
        batch.drop_column("last_signed_in_at")
