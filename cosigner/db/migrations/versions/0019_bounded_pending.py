"""bounded pending rows: who started a single sign-on, and re-derivable Slack link tokens

* ``oidc_logins.address``: the client address (an IPv6 address by its /64) that started
  the sign-in; ``/ui/oidc/start`` refuses (429) once ``settings.oidc_pending_per_address_max``
  unfinished sign-ins of that address are within their lifetime.
* ``slack_link_tokens.seed``: random; the URL token is HMAC-SHA256 of it under the
  tenant's Slack signing secret, so a still-valid unused token is sent again instead of a
  new row being written for every click (the database still holds no usable token).

Rows from before stay ``NULL``: they count for no address, and are not reused.

Revision ID: 0019_bounded_pending
Revises: 0018_signin_freshness
Create Date: 2026-12-01 06:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019_bounded_pending"
down_revision: str | Sequence[str] | None = "0018_signin_freshness"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("oidc_logins") as batch:
        batch.add_column(sa.Column("address", sa.String(64), nullable=True))
        batch.create_index("ix_oidc_logins_address", ["address", "expires_at"])
    with op.batch_alter_table("slack_link_tokens") as batch:
        batch.add_column(sa.Column("seed", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("slack_link_tokens") as batch:
        batch.drop_column("seed")
    with op.batch_alter_table("oidc_logins") as batch:
        batch.drop_index("ix_oidc_logins_address")
        batch.drop_column("address")
