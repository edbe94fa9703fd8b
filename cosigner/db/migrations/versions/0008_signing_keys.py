"""signing keys and replica generations in the database (issue 13)

Revision ID: 0008_signing_keys
Revises: 0007_subjects
Create Date: 2026-12-02 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_signing_keys"
down_revision: str | Sequence[str] | None = "0007_subjects"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "signing_keys",
        sa.Column("kid", sa.String(length=64), nullable=False),
        sa.Column("x", sa.String(length=64), nullable=False),
        sa.Column("private_sealed", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("activates_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("not_after", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("kid"),
    )
    generations = op.create_table(
        "replica_generations",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    # Seeded, so that bumping one is always a plain UPDATE (no insert race).
    op.bulk_insert(generations, [{"name": "signing_keys", "generation": 0},
                                 {"name": "credentials", "generation": 0}])


def downgrade() -> None:
    op.drop_table("replica_generations")
    op.drop_table("signing_keys")
