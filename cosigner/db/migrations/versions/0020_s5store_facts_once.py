"""facts once: permit tokens stored decoded, event hashes as bytes, call inputs keyed once

* ``decisions.response``: a stored answer holding a permit token is rewritten in stored
  form 2 (:class:`cosigner.db.compressed.ResponseJSON`): the token's header, claims and
  signature decoded inside the answer's compressed frame, where the claims' decision id,
  args hash, policy and permit id are back-references. Reads rebuild the token byte for
  byte. Both SQLite and PostgreSQL (``bytea`` since 0017), rows rewritten in pages of
  :data:`PAGE`.
* ``audit_events.hash``, ``decisions.request_hash``, ``args_hash`` and
  ``policy_revision``, ``permits.args_hash``: the ``sha256:<hex>`` text (71 characters)
  becomes the digest's 32 bytes (:class:`cosigner.db.digest.Sha256Digest`; reads give
  the same text).
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
    _recreate_tables(with_rowid=False)


def downgrade() -> None:
    from cosigner.db.compressed import compress, decompress

    def unpack(stored: Any) -> bytes | None:
        data = stored.encode() if isinstance(stored, str) else bytes(stored)
        return compress(decompress(data)) if data[:1] == b"\x02" else None

    _rewrite_responses(unpack)
    _convert_hashes(upgrade=False)
    _recreate_tables(with_rowid=True)


def _recreate_tables(*, with_rowid: bool) -> None:
    """SQLite: copy the :data:`TABLES` into tables with or without a rowid (explicit both
    ways: a copy would otherwise keep the reflected ``WITHOUT ROWID``)."""
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        with op.batch_alter_table(table, recreate="always",
                                  table_kwargs={"sqlite_with_rowid": with_rowid}):
            pass


#: Hash columns stored as digests: (table, its key column, a key below every key, columns)
HASHES: tuple[tuple[str, str, Any, tuple[str, ...]], ...] = (
    ("audit_events", "id", 0, ("hash",)),
    ("decisions", "id", "", ("request_hash", "args_hash", "policy_revision")),
    ("permits", "jti", "", ("args_hash",)))


def _convert_hashes(*, upgrade: bool) -> None:
    """The :data:`HASHES` columns: ``sha256:<hex>`` text ↔ the digest's 32 bytes, other
    text behind a marker byte (:mod:`cosigner.db.digest`)."""
    if op.get_bind().dialect.name == "postgresql":
        for name, _, _, columns in HASHES:
            for column in columns:
                op.execute(f"ALTER TABLE {name} ALTER COLUMN {column} TYPE "
                           + (_PG_TO_BYTES if upgrade else _PG_TO_TEXT).format(c=column))
        return
    from cosigner.db.digest import pack, unpack

    bind = op.get_bind()
    for name, key, low, columns in HASHES:
        table = sa.table(name, sa.column(key), *(sa.column(c) for c in columns))
        kind: sa.types.TypeEngine[Any] = sa.LargeBinary() if upgrade else sa.String()
        convert = pack if upgrade else unpack
        after = low
        while True:
            rows = bind.execute(sa.select(table).where(table.c[key] > after)
                                .order_by(table.c[key]).limit(PAGE)).all()
            if not rows:
                break
            updates = [{"k": row[0], **{"v_" + c: convert(v) if v is not None and isinstance(
                v, str) == upgrade else v for c, v in zip(columns, row[1:], strict=True)}}
                for row in rows]
            bind.execute(table.update().where(table.c[key] == sa.bindparam("k")).values(
                {c: sa.bindparam("v_" + c, type_=kind) for c in columns}), updates)
            after = rows[-1][0]


_PG_TO_BYTES = ("bytea USING CASE WHEN {c} ~ '^sha256:[0-9a-f]{{64}}$' "
                "THEN decode(substr({c}, 8), 'hex') "
                "WHEN octet_length({c}) = 31 THEN '\\x0101'::bytea || convert_to({c}, 'UTF8') "
                "ELSE '\\x00'::bytea || convert_to({c}, 'UTF8') END")
_PG_TO_TEXT = ("varchar(71) USING CASE WHEN length({c}) = 32 "
               "THEN 'sha256:' || encode({c}, 'hex') "
               "WHEN get_byte({c}, 0) = 1 THEN convert_from(substr({c}, 3), 'UTF8') "
               "ELSE convert_from(substr({c}, 2), 'UTF8') END")


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
