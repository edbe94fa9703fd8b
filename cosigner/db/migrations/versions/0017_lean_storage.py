"""lean storage: event bodies, decision responses and stored call inputs compressed

``audit_events.body``, ``decisions.response`` and ``call_inputs.input`` now hold
``b"\\x01" + zstd frame`` (dictionary v1, :mod:`cosigner.db.compressed`) for new rows.
Existing rows are not rewritten: they read back as before.

* PostgreSQL: the three columns become ``bytea``; each existing value keeps its exact
  text as UTF-8 bytes (``convert_to``), which the reader tells from a compressed value by
  its first byte. An event body is the RFC 8785 text its hash covers, byte for byte.
* SQLite: nothing to alter (a column's declared type does not restrict what it holds):
  old values stay TEXT, new ones are BLOBs.

Revision ID: 0017_lean_storage
Revises: 0016_webauthn
Create Date: 2026-12-01 05:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017_lean_storage"
down_revision: str | Sequence[str] | None = "0016_webauthn"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (("audit_events", "body"), ("decisions", "response"), ("call_inputs", "input"))


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column in COLUMNS:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE bytea "
                   f"USING convert_to({column}::text, 'UTF8')")


def downgrade() -> None:
    # Compressed values cannot be turned back into text by SQL: downgrading needs the
    # application (cosigner.db.compressed.decompress) to rewrite them first.
    raise NotImplementedError("0017_lean_storage cannot be downgraded in SQL")
