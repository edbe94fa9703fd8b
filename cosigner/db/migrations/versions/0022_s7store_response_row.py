"""decision responses stored as a difference from their row (stored form 3)

``decisions.response`` in stored form 2 (token decoded) is rewritten in form 3
(:mod:`cosigner.db.response_row`): the texts of the row's ``id``, ``request_id``,
``args_hash`` and ``policy_revision`` columns inside the answer, the token's header and
its claims become two-byte references; reads put them back from the row. Both SQLite
and PostgreSQL, rows rewritten in pages of :data:`PAGE` ordered by id.

Downgrade: form 3 back to form 2.

Revision ID: 0022_s7store_response_row
Revises: 0021_s7store_compact_ids
Create Date: 2026-12-01 18:40:00
"""

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0022_s7store_response_row"
down_revision: str | Sequence[str] | None = "0021_s7store_compact_ids"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Rows read and rewritten per statement.
PAGE = 2000


def upgrade() -> None:
    from cosigner.db import compressed, response_row

    def to_row_form(stored: bytes, refs: tuple[str | None, ...]) -> bytes | None:
        if stored[:1] != bytes([compressed.V2_TOKEN]):
            return None
        return response_row.pack(compressed._unpack_response(stored), refs)  # noqa: SLF001

    _rewrite(to_row_form)


def downgrade() -> None:
    from cosigner.db import compressed, response_row

    def to_form_2(stored: bytes, refs: tuple[str | None, ...]) -> bytes | None:
        if stored[:1] != bytes([compressed.V3_ROW]):
            return None
        return compressed.bind_response(response_row.unpack(stored, refs))

    _rewrite(to_form_2)


def _rewrite(rewrite: Callable[[bytes, tuple[str | None, ...]], bytes | None]) -> None:
    """Every ``decisions.response`` through ``rewrite(stored, refs)`` (``None``: keep);
    ``refs`` are the row's :data:`~cosigner.db.response_row.REF_COLUMNS` texts (the fifth,
    ``run_id``, since 0024's form 7)."""
    from cosigner.db.digest import unpack as digest_text
    from cosigner.db.sqlite_compact import unpack_uuid

    bind = op.get_bind()
    sqlite = bind.dialect.name == "sqlite"
    # The driver's values (the id packed on SQLite since 0021, digests as bytes since 0020).
    decisions = sa.table("decisions", sa.column("id"), sa.column("request_id"),
                         sa.column("args_hash"), sa.column("policy_revision"),
                         sa.column("run_id"), sa.column("response"))
    after: Any = None
    while True:
        query = sa.select(decisions)
        if after is not None:
            query = query.where(decisions.c.id > sa.literal(
                after, sa.LargeBinary() if isinstance(after, bytes) else sa.String()))
        rows = bind.execute(query.order_by(decisions.c.id).limit(PAGE)).all()
        if not rows:
            return
        updates = []
        for key, request_id, args_hash, policy_revision, run_id, response in rows:
            if isinstance(response, str):
                continue  # JSON text written before 0017: no token decoded, nothing to do
            refs = (unpack_uuid(key) if sqlite else key, request_id,
                    None if args_hash is None else digest_text(args_hash),
                    None if policy_revision is None else digest_text(policy_revision),
                    run_id)
            new = rewrite(bytes(response), refs)
            if new is not None:
                updates.append({"k": key, "v": new})
        if updates:
            bind.execute(decisions.update().where(decisions.c.id == sa.bindparam("k"))
                         .values(response=sa.bindparam("v", type_=sa.LargeBinary())),
                         updates)
        after = rows[-1][0]
        after = bytes(after) if isinstance(after, memoryview) else after
