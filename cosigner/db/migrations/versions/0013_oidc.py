"""single sign-on: pending OpenID Connect sign-ins; how each web session authenticated

``oidc_logins`` holds each started sign-in (state hash, browser binding, nonce, PKCE
verifier) until its callback consumes it, so any replica can finish it and a state works
once. ``web_sessions`` gains ``auth_method`` (existing sessions: ``password``), ``acr``,
``amr`` and ``auth_time``, which step-up requirements are checked against.

Revision ID: 0013_oidc
Revises: 0012_run_started_key_alg
Create Date: 2026-12-01 05:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_oidc"
down_revision: str | Sequence[str] | None = "0012_run_started_key_alg"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "oidc_logins",
        sa.Column("state_hash", sa.String(length=64), nullable=False),
        sa.Column("browser_hash", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("nonce", sa.String(length=128), nullable=False),
        sa.Column("code_verifier", sa.String(length=128), nullable=False),
        sa.Column("next_path", sa.String(length=512), nullable=False),
        sa.Column("step_up", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("state_hash"),
    )
    op.create_index("ix_oidc_logins_expires", "oidc_logins", ["expires_at"])
    with op.batch_alter_table("web_sessions") as batch:
        batch.add_column(sa.Column("auth_method", sa.String(length=16), nullable=False,
                                   server_default="password"))
        batch.add_column(sa.Column("acr", sa.String(length=256), nullable=True))
        batch.add_column(sa.Column("amr", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("auth_time", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("web_sessions") as batch:
        batch.drop_column("auth_time")
        batch.drop_column("amr")
        batch.drop_column("acr")
        batch.drop_column("auth_method")
    op.drop_index("ix_oidc_logins_expires", table_name="oidc_logins")
    op.drop_table("oidc_logins")
