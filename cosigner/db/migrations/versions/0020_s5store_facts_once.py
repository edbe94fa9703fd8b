"""facts once: permit tokens stored decoded, event hashes as bytes, call inputs keyed once

* ``decisions.response``: a stored answer holding a permit token is rewritten in stored
  form 2 (:class:`cosigner.db.compressed.ResponseJSON`): the token's header, claims and
  signature decoded inside the answer's compressed frame, where the claims' decision id,
  args hash, policy and permit id are back-references. Reads rebuild the token byte for
  byte. Both SQLite and PostgreSQL (``bytea`` since 0017), rows rewritten in pages of
  :data:`PAGE`.
* ``audit_events.hash``: the ``sha256:<hex>`` text (71 characters) becomes the digest's
  32 bytes (:class:`cosigner.db.digest.Sha256Digest`; reads give the same text).
  PostgreSQL: ``ALTER … TYPE bytea USING decode(…)``; SQLite: rows rewritten in pages.
* SQLite: ``call_inputs`` becomes a ``WITHOUT ROWID`` table (its text primary key was
  stored twice: in the table and in its automatic unique index); the rows are copied
  into the new table. PostgreSQL has no rowid: nothing to change.

Downgrade: responses back to stored form 1 (the token inside the frame), tables back
to rowid tables.

Revision ID: 0020_s5store_facts_once
Revises: 0019_bounded_pending
Create Date: 2026-12-01 08:40:00
"""

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0020_s5store_facts_once"
down_revision: str | Sequence[str] | None = "0019_bounded_pending"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Rows read and rewritten per statement.
PAGE = 2000
TABLES = ("call_inputs",)


def upgrade() -> None:
    from cosigner.db.compressed import compress, decompress, loads_json, pack_response

    def repack(stored: Any) -> bytes | None:
        data = stored.encode() if isinstance(stored, str) else bytes(stored)
        if data[:1] == b"\x02":
            return None  # already form 2
        value = loads_json(decompress(data))
        packed = pack_response(value)
        if packed is None:
            return None if data[:1] == b"\x01" else compress(data)
        return packed

    _rewrite_responses(repack)
    _convert_hashes(upgrade=True)
    if op.get_bind().dialect.name == "sqlite":
        for table in TABLES:
            with op.batch_alter_table(table, recreate="always",
                                      table_kwargs={"sqlite_with_rowid": False}):
                pass


def downgrade() -> None:
    from cosigner.db.compressed import compress, decompress

    def unpack(stored: Any) -> bytes | None:
        data = stored.encode() if isinstance(stored, str) else bytes(stored)
        return compress(decompress(data)) if data[:1] == b"\x02" else None

    _rewrite_responses(unpack)
    _convert_hashes(upgrade=False)
    if op.get_bind().dialect.name == "sqlite":
        for table in TABLES:
            with op.batch_alter_table(table, recreate="always"):
                pass


def _convert_hashes(*, upgrade: bool) -> None:
    """``audit_events.hash``: ``sha256:<hex>`` text ↔ the digest's 32 bytes
    (:mod:`cosigner.db.digest`; every stored event hash has that form)."""
    if op.get_bind().dialect.name == "postgresql":
        if upgrade:
            op.execute("ALTER TABLE audit_events ALTER COLUMN hash TYPE bytea USING "
                       "CASE WHEN hash ~ '^sha256:[0-9a-f]{64}$' "
                       "THEN decode(substr(hash, 8), 'hex') "
                       "WHEN octet_length(hash) = 31 "
                       "THEN '\\x0101'::bytea || convert_to(hash, 'UTF8') "
                       "ELSE '\\x00'::bytea || convert_to(hash, 'UTF8') END")
        else:
            op.execute("ALTER TABLE audit_events ALTER COLUMN hash TYPE varchar(71) USING "
                       "CASE WHEN length(hash) = 32 THEN 'sha256:' || encode(hash, 'hex') "
                       "WHEN get_byte(hash, 0) = 1 THEN convert_from(substr(hash, 3), 'UTF8') "
                       "ELSE convert_from(substr(hash, 2), 'UTF8') END")
        return
    from cosigner.db.digest import pack, unpack

    bind = op.get_bind()
    events = sa.table("audit_events", sa.column("id", sa.Integer), sa.column("hash"))
    after = 0
    while True:
        rows = bind.execute(sa.select(events.c.id, events.c.hash).where(events.c.id > after)
                            .order_by(events.c.id).limit(PAGE)).all()
        if not rows:
            return
        if upgrade:
            updates = [{"key": r.id, "value": pack(r.hash)} for r in rows
                       if isinstance(r.hash, str)]
            kind: sa.types.TypeEngine[Any] = sa.LargeBinary()
        else:
            updates = [{"key": r.id, "value": unpack(r.hash)} for r in rows
                       if not isinstance(r.hash, str)]
            kind = sa.String()
        if updates:
            bind.execute(events.update().where(events.c.id == sa.bindparam("key"))
                         .values(hash=sa.bindparam("value", type_=kind)), updates)
        after = rows[-1].id


def _rewrite_responses(rewrite: Callable[[Any], bytes | None]) -> None:
    """``decisions.response`` of every row through ``rewrite`` (``None``: keep it), in
    pages ordered by id."""
    bind = op.get_bind()
    decisions = sa.table("decisions", sa.column("id", sa.String),
                         sa.column("response"))  # the driver's value: TEXT before 0017 on SQLite
    after = ""
    while True:
        rows = bind.execute(sa.select(decisions.c.id, decisions.c.response)
                            .where(decisions.c.id > after)
                            .order_by(decisions.c.id).limit(PAGE)).all()
        if not rows:
            return
        updates = []
        for row in rows:
            new = rewrite(row.response)
            if new is not None:
                updates.append({"key": row.id, "value": new})
        if updates:
            bind.execute(decisions.update().where(decisions.c.id == sa.bindparam("key"))
                         .values(response=sa.bindparam("value", type_=sa.LargeBinary)), updates)
        after = rows[-1].id
