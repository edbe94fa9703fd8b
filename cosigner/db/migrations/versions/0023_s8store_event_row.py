"""audit event bodies stored as a difference from the rows before them (forms 4-6)

``audit_events.body`` (form 1: the canonical text, zstd-compressed; or TEXT written
before 0017) is rewritten as :mod:`cosigner.db.event_row` stores new events: its
``prev_hash`` text left to the ``hash`` column of the row before (``tenant``,
``seq - 1``) when that row is there, and two consecutive events of one decision (or one
approval request) in one frame held by the first row (form 4), the second row pointing
at it (form 5); a lone event is form 6. A rewritten body is kept only when
:func:`cosigner.db.event_row.text_with` reads it back as exactly its text. Both SQLite
and PostgreSQL, rows read in pages of :data:`PAGE` in ``(tenant, seq)`` order.

Downgrade: forms 4-6 back to form 1.

Revision ID: 0023_s8store_event_row
Revises: 0022_s7store_response_row
Create Date: 2026-12-01 21:20:00
"""

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0023_s8store_event_row"
down_revision: str | Sequence[str] | None = "0022_s7store_response_row"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Rows read, and rewritten, per statement.
PAGE = 2000

#: The driver's values (digests and, on SQLite, ids packed since 0020/0021).
_EVENTS = sa.table("audit_events", sa.column("tenant"), sa.column("seq"),
                   sa.column("decision_id"), sa.column("approval_id"), sa.column("hash"),
                   sa.column("body"))


def upgrade() -> None:
    _write(_new_forms(_rows()))


def downgrade() -> None:
    _write(_form_1(_rows()))


def _new_forms(rows: Iterator[Any]) -> Iterator[tuple[Any, bytes]]:
    """``(row, new body)`` for the rows that get a form 4, 5 or 6."""
    before: Any = None  # the row just before (same tenant, seq - 1), if read
    held: Any = None  # (a form 1 row not yet rewritten, the hash text before it)
    for row in rows:
        if before is not None and (before.tenant != row.tenant or before.seq != row.seq - 1):
            before = None
        if held is not None:
            first, first_prev = held
            held = None
            pair = (_pair(first, first_prev, row)
                    if before is first and _old(row.body) and _one_subject(first, row)
                    else None)
            if pair is not None:
                yield from pair
                before = row
                continue
            yield from _single(first, first_prev)
        if _old(row.body):
            held = (row, _hash_text(before))
        before = row
    if held is not None:
        yield from _single(*held)


def _single(row: Any, prev: str | None) -> list[tuple[Any, bytes]]:
    from cosigner.db import event_row

    text = _text(row.body)
    if text is None:
        return []
    new = event_row.pack_single(text, prev)
    if new[0] != event_row.V6_SINGLE or _read(new, prev, None) != text:
        return []
    return [(row, new)]


def _pair(first: Any, first_prev: str | None, second: Any) -> list[tuple[Any, bytes]] | None:
    from cosigner.db import event_row

    texts, own = (_text(first.body), _text(second.body)), _hash_text(first)
    if texts[0] is None or texts[1] is None or own is None:
        return None
    packed = event_row.pack_pair(texts[0], first_prev, texts[1], own)
    if packed is None:
        return None
    head, tail = packed
    if (_read(head, first_prev, None) != texts[0]
            or _read(tail, own, head) != texts[1]):
        return None
    return [(first, head), (second, tail)]


def _hash_text(row: Any) -> str | None:
    """The ``hash`` text of ``row`` (``None``: no row, or a value that does not read)."""
    from cosigner.db.digest import unpack

    try:
        return None if row is None else unpack(row.hash)
    except ValueError:
        return None


def _text(body: Any) -> bytes | None:
    """The text of a form 1 (or TEXT) body; ``None`` for one that does not read (left as
    it is): a damaged frame (``ValueError``), or a damaged frame header declaring more
    bytes than can be allocated (``MemoryError``: zstd allocates the declared size before
    decoding, as :mod:`cosigner.db.event_row` explains)."""
    from cosigner.db.compressed import decompress

    try:
        return decompress(body)
    except (ValueError, MemoryError):
        return None


def _read(stored: bytes, prev: str | None, prev_stored: bytes | None) -> bytes | None:
    from cosigner.db import event_row

    try:
        return event_row.text_with(stored, prev, prev_stored).encode()
    except ValueError:
        return None


def _form_1(rows: Iterator[Any]) -> Iterator[tuple[Any, bytes]]:
    """``(row, form 1 body)`` for every row in form 4, 5 or 6."""
    from cosigner.db.compressed import compress

    before: Any = None
    for row in rows:
        if before is not None and (before.tenant != row.tenant or before.seq != row.seq - 1):
            before = None
        if not _old(row.body):
            text = _read(row.body, _hash_text(before),
                         before.body if before is not None else None)
            if text is not None:  # else: a row that did not read before either (kept)
                yield row, compress(text)
        before = row


def _old(body: Any) -> bool:
    """True for a body stored before 0023 (form 1, or TEXT)."""
    from cosigner.db import event_row

    return isinstance(body, str) or bytes(body)[:1] not in (
        bytes([event_row.V4_PAIR]), bytes([event_row.V5_TAIL]), bytes([event_row.V6_SINGLE]))


def _one_subject(first: Any, second: Any) -> bool:
    """As the chain pairs events: one decision, or (no decision) one approval request."""
    if first.decision_id is not None:
        return bool(first.decision_id == second.decision_id)
    return first.approval_id is not None and first.approval_id == second.approval_id


def _rows() -> Iterator[Any]:
    """Every event row in ``(tenant, seq)`` order, read :data:`PAGE` at a time."""
    bind = op.get_bind()
    after: tuple[str, int] | None = None
    while True:
        query = sa.select(_EVENTS)
        if after is not None:
            query = query.where(sa.tuple_(_EVENTS.c.tenant, _EVENTS.c.seq) > sa.tuple_(
                sa.literal(after[0], sa.String()), sa.literal(after[1], sa.BigInteger())))
        rows = bind.execute(query.order_by(_EVENTS.c.tenant, _EVENTS.c.seq)
                            .limit(PAGE)).all()
        if not rows:
            return
        for row in rows:
            yield _Row(row.tenant, int(row.seq), _plain(row.decision_id),
                       _plain(row.approval_id), _plain(row.hash), _plain(row.body))
        after = (rows[-1].tenant, int(rows[-1].seq))


class _Row:
    __slots__ = ("tenant", "seq", "decision_id", "approval_id", "hash", "body")

    def __init__(self, tenant: str, seq: int, decision_id: Any, approval_id: Any,
                 hash_: Any, body: Any) -> None:
        self.tenant, self.seq = tenant, seq
        self.decision_id, self.approval_id, self.hash, self.body = (
            decision_id, approval_id, hash_, body)


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview | bytearray) else value


def _write(changes: Iterator[tuple[Any, bytes]]) -> None:
    bind = op.get_bind()
    statement = _EVENTS.update().where(
        _EVENTS.c.tenant == sa.bindparam("t"), _EVENTS.c.seq == sa.bindparam("s")).values(
        body=sa.bindparam("v", type_=sa.LargeBinary()))
    batch: list[dict[str, Any]] = []
    for row, body in changes:
        batch.append({"t": row.tenant, "s": row.seq, "v": body})
        if len(batch) >= PAGE:
            bind.execute(statement, batch)
            batch = []
    if batch:
        bind.execute(statement, batch)
