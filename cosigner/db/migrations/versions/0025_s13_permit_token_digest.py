"""permits.token_digest: 128 bits of SHA-256 of the minted token

A redeem that presents exactly the token a permit's row was minted with (the row's
``token_digest`` equals :func:`cosigner.permits.tokens.token_digest` of the presented
text) needs no Ed25519 verification: the signature is the one the server made. Rows
minted before this migration keep NULL and are verified as before. A plain ADD COLUMN on
both databases (SQLite: no table copy); downgrade drops it.

Revision ID: 0025_s13_permit_token_digest
Revises: 0024_s12store_response_bare
Create Date: 2026-12-02 13:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025_s13_permit_token_digest"
down_revision: str | Sequence[str] | None = "0024_s12store_response_bare"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("permits", sa.Column("token_digest", sa.LargeBinary(length=16),
                                       nullable=True))


def downgrade() -> None:
    op.drop_column("permits", "token_digest")
