"""compact ids and instants on SQLite: decision and permit ids as 16 bytes, times as integers

SQLite only (:mod:`cosigner.db.sqlite_compact`): the decision-id columns
(``decisions.id``, ``permits.decision_id``, ``audit_events.decision_id``,
``approvals.decision_id``, ``call_inputs.decision_id``, ``decision_outcomes.decision_id``)
hold a canonical UUID as its 16 bytes, the permit-id columns (``permits.jti``,
``audit_events.permit_jti``, ``approvals.permit_jti``) 32 hex digits as their 16 bytes,
any other text behind a marker byte; ``decisions.created_at``, ``permits``' four
instants and ``audit_events.time`` hold microseconds since 1970 (integers) instead of
``DATETIME`` text. The columns' declared types stay (SQLite keeps a BLOB or an integer in
a TEXT or NUMERIC column as it is), so only the rows are rewritten, in pages of
:data:`PAGE` by rowid (``call_inputs``, ``WITHOUT ROWID``: by its key, the texts left
sorting before every converted BLOB). PostgreSQL keeps its ``varchar`` and
``timestamptz`` columns: nothing to do there.

Downgrade: the same rows back to text.

Revision ID: 0021_s7store_compact_ids
Revises: 0020_s5store_facts_once
Create Date: 2026-12-01 18:20:00
"""

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0021_s7store_compact_ids"
down_revision: str | Sequence[str] | None = "0020_s5store_facts_once"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Rows read and rewritten per statement.
PAGE = 2000
UUIDS = "uuid"
HEXES = "hex"
TIMES = "time"
#: rowid tables: (table, ((column, kind), …))
COLUMNS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("decisions", (("id", UUIDS), ("created_at", TIMES))),
    ("permits", (("jti", HEXES), ("decision_id", UUIDS), ("issued_at", TIMES),
                 ("expires_at", TIMES), ("redeemed_at", TIMES), ("revoked_at", TIMES))),
    ("audit_events", (("decision_id", UUIDS), ("permit_jti", HEXES), ("time", TIMES))),
    ("approvals", (("decision_id", UUIDS), ("permit_jti", HEXES))),
    ("decision_outcomes", (("decision_id", UUIDS),)),
)


def _converters(upgrade: bool) -> dict[str, Callable[[Any], Any]]:
    from cosigner.db import sqlite_compact as c

    def to_text(value: Any) -> str:
        return c.instant(value).isoformat(" ", "microseconds")[:26]  # SQLAlchemy's text

    if upgrade:
        return {UUIDS: c.pack_uuid, HEXES: c.pack_hex, TIMES: lambda v: c.micros(c.instant(v))}
    return {UUIDS: c.unpack_uuid, HEXES: c.unpack_hex, TIMES: to_text}


def _stale(value: Any, kind: str, upgrade: bool) -> bool:
    """Whether ``value`` (the driver's) is still in the other form."""
    if value is None:
        return False
    if kind == TIMES:
        return isinstance(value, str) if upgrade else isinstance(value, int)
    return isinstance(value, str) == upgrade


def upgrade() -> None:
    _rewrite(upgrade=True)


def downgrade() -> None:
    _rewrite(upgrade=False)


def _rewrite(*, upgrade: bool) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    convert = _converters(upgrade)
    for name, columns in COLUMNS:
        table = sa.table(name, sa.column("rowid"), *(sa.column(c) for c, _ in columns))
        after = -(2 ** 63)
        while True:
            rows = bind.execute(sa.select(table).where(table.c.rowid > after)
                                .order_by(table.c.rowid).limit(PAGE)).all()
            if not rows:
                break
            updates = []
            for row in rows:
                values = {"v_" + c: convert[kind](v) if _stale(v, kind, upgrade) else v
                          for (c, kind), v in zip(columns, row[1:], strict=True)}
                updates.append({"k": row[0], **values})
            bind.execute(table.update().where(table.c.rowid == sa.bindparam("k")).values(
                {c: sa.bindparam("v_" + c, type_=_driver_type(kind, upgrade))
                 for c, kind in columns}), updates)
            after = rows[-1][0]
    _rewrite_call_inputs(convert[UUIDS], upgrade)


def _driver_type(kind: str, upgrade: bool) -> sa.types.TypeEngine[Any]:
    if kind == TIMES:
        return sa.BigInteger() if upgrade else sa.String()
    return sa.LargeBinary() if upgrade else sa.String()


def _rewrite_call_inputs(convert: Callable[[Any], Any], upgrade: bool) -> None:
    """``call_inputs`` has no rowid: its key is rewritten in key order. Every TEXT sorts
    before every BLOB in SQLite, so the rows still to convert are the TEXT keys (up) or
    the BLOB keys (down) after the last one done."""
    bind = op.get_bind()
    table = sa.table("call_inputs", sa.column("decision_id"))
    kind = sa.String() if upgrade else sa.LargeBinary()
    after: Any = "" if upgrade else b""
    while True:
        keys = sa.select(table.c.decision_id)
        if upgrade:
            keys = keys.where(table.c.decision_id >= sa.literal(after, kind),
                              sa.func.typeof(table.c.decision_id) == "text")
        else:
            keys = keys.where(table.c.decision_id >= sa.literal(after, kind),
                              sa.func.typeof(table.c.decision_id) == "blob")
        rows = bind.execute(keys.order_by(table.c.decision_id).limit(PAGE)).all()
        if not rows:
            return
        updates = [{"k": key, "v": convert(key)} for (key,) in rows]
        bind.execute(table.update().where(table.c.decision_id == sa.bindparam("k", type_=kind))
                     .values(decision_id=sa.bindparam("v", type_=sa.LargeBinary()
                                                      if upgrade else sa.String())), updates)
        after = rows[-1][0]
