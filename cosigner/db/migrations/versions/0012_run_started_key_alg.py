"""run contracts after the first call; one JWS alg per signing key

``ix_decisions_run`` lets registering a run contract ask "has this run started?"
(``run_started``); ``signing_keys.alg`` pins each key to the one JWS ``alg`` it was created
with (``Ed25519``, or ``EdDSA`` under ``COSIGNER_SIGNING_ALG``); existing keys are
``Ed25519``.

Revision ID: 0012_run_started_key_alg
Revises: 0011_barriers
Create Date: 2026-12-01 03:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_run_started_key_alg"
down_revision: str | Sequence[str] | None = "0011_barriers"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_decisions_run", "decisions", ["tenant", "run_id"])
    with op.batch_alter_table("signing_keys") as batch:
        batch.add_column(sa.Column("alg", sa.String(length=16), nullable=False,
                                   server_default="Ed25519"))


def downgrade() -> None:
    with op.batch_alter_table("signing_keys") as batch:
        batch.drop_column("alg")
    op.drop_index("ix_decisions_run", table_name="decisions")
