"""``audit_events.body`` stored as a difference from the rows before it (issue 20).

An event's canonical text holds ``prev_hash``: the ``hash`` column of the row just before
it (``tenant``, ``seq - 1``), 64 random hex digits that no dictionary compresses. And
the events of one decision (``decision.made`` then ``permit.minted``) repeat each other's
args hash, policy revision, decision id, run and actor. Stored forms (the format byte
after :mod:`cosigner.db.compressed`'s 1, 2 and 3):

* ``4`` (pair head) ``+ zstd frame`` of two texts, this row's and the next row's
  (separated by one ``0x1B`` byte), each with its ``prev_hash`` text replaced by one
  ``0x1A`` byte: the first stands for the hash of the row before this one, the second
  for this row's own hash (the next row's ``prev_hash``);
* ``5`` (pair tail), exactly one byte: the text is the second one of the frame in the
  row before;
* ``6`` (single) ``+ zstd frame`` of this row's text, ``prev_hash`` replaced likewise.

Frames are dictionary v1 frames without zstd's magic number
(:func:`cosigner.db.compressed.compress_bare`). Exactness: a text holding a ``0x1A`` or
``0x1B`` byte (never canonical JSON, which escapes control characters) is not stored
this way, nor a ``prev_hash`` that is not ``sha256:`` and 64
lower-case hex digits (the 32 bytes :class:`~cosigner.db.digest.Sha256Digest` stores,
read back as exactly that text). Replacing every occurrence of one text by a byte that
neither it nor the text holds, and back, gives the text again
(tests/db/test_event_row.py, hypothesis). A first event whose predecessor may not be
there (``seq`` 1, an event appended by a prune) keeps its ``prev_hash`` in the frame.

Reading: :class:`EventBody` adds to the column, wherever it is selected, the hash of the
row before (and for a tail that row's stored body) through one correlated subquery on the
``(tenant, seq)`` key (:class:`EventRead`), and its result processor gives the exact
text that was hashed. So every reader (``select(audit_events.c.body)`` anywhere) reads
the same text as before; a form 4–6 value reached any other way (raw SQL) is refused
rather than misread. Retention (:mod:`cosigner.audit.prune`) rewrites the first kept rows
so that none depends on a deleted one.

An event that does not read: when a row an event depends on is gone or damaged behind
Cosigner's back (deleted by hand, a partial restore, disk corruption: the row before it
for forms 4–6, its frame's row for a tail, or its own stored bytes), decoding it raises
:class:`EventUnreadable`, the one exception type for that outcome (a
:class:`~cosigner.core.errors.IntegrityFault`: a 500 ``audit_event_unreadable`` with a
fixed detail wherever nobody catches it, never ``internal_error`` and never internals; and
a ``ValueError``). Every reader of event bodies does one of two things with it:

* it leaves the event out, with a logged warning (:func:`readable`), where an answer is a
  listing or a statistic that stays true without it (the events API and export, the run
  panel's logged arguments, replay and shadow reports, counting what they left out);
* it lets :class:`EventUnreadable` go up (:func:`document`), where leaving the event out
  would change an authorization answer (a permit's ``redeemed_by_you``): nothing is ever
  allowed on the basis of a record that does not read.

A reader that must carry on past one such event selects :func:`lenient` (each value the
text or an :class:`Unreadable` marker) instead of the column, whose result processor
raises for the first one and so fails the whole result.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.visitors import InternalTraversal
from sqlalchemy.types import TypeDecorator

from cosigner.core.canonical import hash_bytes
from cosigner.core.errors import IntegrityFault
from cosigner.db import compressed
from cosigner.db.driver_types import RawBlob

log = logging.getLogger("cosigner.audit")

#: Format bytes (module docstring).
V4_PAIR = 4
V5_TAIL = 5
V6_SINGLE = 6
TAIL = bytes([V5_TAIL])
#: Stands for the ``prev_hash`` text inside a frame.
MARK = b"\x1a"
#: Between the two texts of a pair.
SEPARATOR = b"\x1b"
#: The two as byte values: ``0x1A in text`` is a byte search, where ``b"\x1a" in text``
#: first tries the needle as an integer and raises and clears a TypeError (~1.8k
#: instructions a test, on every event written).
_MARK, _SEPARATOR = MARK[0], SEPARATOR[0]
#: Leading bytes of what :class:`EventRead` selects for forms 4/6 and 5 (never a stored
#: form's first byte: those are 1..6, or a JSON text's first character).
_READ_OWN, _READ_TAIL = 0x1F, 0x1E
_PREFIX = "sha256:"
_PREFIX_BYTES = _PREFIX.encode()
#: A hash :class:`~cosigner.db.digest.Sha256Digest` stores as its 32 bytes (``sha256:``
#: and 64 lower-case hex digits: read back as exactly this text).
_HASH = re.compile(r"sha256:[0-9a-f]{64}")


class EventUnreadable(IntegrityFault, ValueError):
    """An audit event's stored body does not give its text back (module docstring): the
    row before it or its frame's row is gone, its stored bytes are damaged, its text is not
    a JSON object, or (:func:`document` given the ``hash`` column) it does not hash to its
    row's hash.

    On the wire a 500 ``audit_event_unreadable`` with a fixed ``detail``; ``reason`` (what
    the decoder found), ``tenant`` and ``seq`` (when the reader knows them) are for the
    log only.
    """

    DETAIL = ("an audit event this answer depends on does not read back from the decision "
              "log (rows deleted or damaged outside Cosigner); run `cosigner audit verify` "
              "on an export to locate it")

    def __init__(self, reason: str, *, tenant: str | None = None,
                 seq: int | None = None) -> None:
        super().__init__(self.DETAIL, reason=reason)
        self.tenant, self.seq = tenant, seq

    def __str__(self) -> str:  # logs and tracebacks; the wire has ``detail`` only
        return f"{self.reason} (audit event {self.where()})"

    def where(self) -> str:
        """``tenant/seq`` of the event (``?`` for what the reader did not know)."""
        return f"{self.tenant or '?'}/{'?' if self.seq is None else self.seq}"


class Unreadable:
    """What :func:`lenient` gives for an event whose body does not read: the
    :class:`EventUnreadable` that decoding it raised (``error``), never a text."""

    __slots__ = ("error",)

    def __init__(self, error: EventUnreadable) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"Unreadable({self.error.reason!r})"


def _prev_ok(prev: str | None) -> bool:
    """True when ``prev`` is a hash the previous row's ``hash`` column holds as 32 bytes
    (so ``"sha256:" + hex`` of those bytes is exactly ``prev``)."""
    return prev is not None and _HASH.fullmatch(prev) is not None


def _marked(text: bytes, prev: str | None) -> bytes:
    return text if prev is None else text.replace(prev.encode("ascii"), MARK)


def pack_single(text: bytes, prev: str | None) -> bytes:
    """The stored form of a lone event's canonical ``text``: form 6 with ``prev``
    (its ``prev_hash``, the hash of the row before) left out, or form 1 when ``prev`` is
    ``None`` (no row before to read it from) or either cannot be stored exactly."""
    if prev is None or _MARK in text or not _prev_ok(prev):
        return compressed.compress(text)
    return bytes([V6_SINGLE]) + compressed.compress_bare(_marked(text, prev))


def pack_pair(first: bytes, first_prev: str | None, second: bytes, second_prev: str
              ) -> tuple[bytes, bytes] | None:
    """``(head, tail)``: the stored forms of two consecutive events' texts, the first's
    row holding both (form 4), the second's form 5. ``second_prev`` must be the first
    event's hash; ``first_prev`` (the hash of the row before) is left out unless
    ``None``. ``None`` when the pair cannot be stored exactly (then store each alone)."""
    if (_MARK in first or _MARK in second or _SEPARATOR in first or _SEPARATOR in second
            or not _prev_ok(second_prev)
            or (first_prev is not None and not _prev_ok(first_prev))):
        return None
    frame = compressed.compress_bare(
        _marked(first, first_prev) + SEPARATOR + _marked(second, second_prev))
    return bytes([V4_PAIR]) + frame, TAIL


def _restore(part: bytes, prev: bytes | None) -> bytes:
    if MARK not in part:
        return part
    if prev is None:
        raise EventUnreadable("an audit event refers to the hash of the event before it, "
                              "which is not in the log (rows deleted outside cosigner audit "
                              "prune?)")
    return part.replace(MARK, prev)


def _parts(stored: bytes) -> tuple[bytes, bytes]:
    """The two texts (marked) of a form 4 value (the last one read is remembered: a
    reader in ``seq`` order meets each frame twice, for its head and its tail)."""
    global _last
    seen = _last
    if seen[0] == stored:
        return seen[1]
    first, found, second = compressed.decompress_bare(stored[1:]).partition(SEPARATOR)
    if not found:
        raise EventUnreadable("damaged audit event pair")
    _last = (stored, (first, second))
    return first, second


_last: tuple[bytes, tuple[bytes, bytes]] = (b"", (b"", b""))


def _resolve(own: bytes, prev: bytes | None, prev_stored: bytes | None) -> str:
    """The text of a form 4, 5 or 6 body ``own``, given the ``prev_hash`` text the row
    before holds (``None``: no such row) and, for a tail, that row's stored body."""
    lead = own[0]
    if lead == V6_SINGLE:
        return _restore(compressed.decompress_bare(own[1:]), prev).decode()
    if lead == V4_PAIR:
        return _restore(_parts(own)[0], prev).decode()
    if own != TAIL:
        raise EventUnreadable("damaged audit event body")
    if prev is None or prev_stored is None or prev_stored[:1] != bytes([V4_PAIR]):
        raise EventUnreadable("an audit event's text is in the row before it, which is not "
                              "in the log (rows deleted outside cosigner audit prune?)")
    return _restore(_parts(prev_stored)[1], prev).decode()


_LEAN = (V4_PAIR, V5_TAIL, V6_SINGLE)


def _unreadable(exc: ValueError) -> EventUnreadable:
    """A decoder's failure as the one exception type: a damaged frame (a frame header
    declaring more than can be allocated included: :mod:`cosigner.db.compressed`) or
    bytes that are not UTF-8."""
    return EventUnreadable(str(exc))


def text_of(value: bytes | bytearray | memoryview | str) -> str:
    """The canonical text of an event as :class:`EventRead` selects it.

    Raises:
        EventUnreadable: the event does not read (module docstring): a damaged frame or
            text, or an event whose predecessor (or, for a tail, its frame's row) is gone.
        ValueError: a form 4–6 value read without :class:`EventRead` (a reader's bug,
            raw SQL, not damage).
    """
    if isinstance(value, str):
        return value  # TEXT written before 0017
    data = bytes(value)
    lead = data[0] if data else 0x20
    if lead in _LEAN:
        raise ValueError("a stored audit event body read without the rows before it "
                         "(select audit_events.body through SQLAlchemy: EventRead)")
    try:
        if lead == _READ_OWN or lead == _READ_TAIL:
            found = data[1:2] == b"\x01"
            prev = _PREFIX_BYTES + data[2:34].hex().encode() if found else None
            rest = data[34:] if found else data[2:]
            if lead == _READ_OWN:
                if not rest[:1]:
                    raise EventUnreadable("damaged audit event read")
                return _resolve(rest, prev, None)
            return _resolve(TAIL, prev, rest if found else None)
        return compressed.decompress(data).decode()
    except EventUnreadable:
        raise
    except ValueError as exc:
        raise _unreadable(exc) from exc


def text_with(stored: bytes | bytearray | memoryview | str, prev_hash: str | None,
              prev_stored: bytes | bytearray | memoryview | str | None) -> str:
    """The canonical text of a stored body given the row before it (its ``hash`` text
    and stored ``body``; ``None`` when there is none): :func:`text_of` for a reader that
    holds the rows in ``seq`` order (an export, a migration) instead of selecting them
    through :class:`EventRead`.

    Raises:
        EventUnreadable: as :func:`text_of` (the row before not given counts as gone).
    """
    if isinstance(stored, str):
        return stored
    data = bytes(stored)
    try:
        if not data or data[0] not in _LEAN:
            return compressed.decompress(data).decode()
        # As EventRead: the row before counts only when its hash is stored as 32 bytes.
        prev = prev_hash.encode() if prev_hash is not None and _HASH.fullmatch(
            prev_hash) else None
        held = prev_stored.encode() if isinstance(prev_stored, str) else (
            None if prev_stored is None else bytes(prev_stored))
        return _resolve(data, prev, held)
    except EventUnreadable:
        raise
    except ValueError as exc:
        raise _unreadable(exc) from exc


def texts_in_order(rows: Sequence[tuple[int, Any, str]], *, skip: int = 0
                   ) -> list[str | Unreadable]:
    """The texts of ``(seq, stored body, hash text)`` rows of one tenant in ``seq`` order,
    each read with the row just before it when that row is among them (a reader of a
    range, e.g. an export, selects the row before the range too and ``skip`` s it): what
    :class:`EventRead` gives, without its subquery per row. :class:`Unreadable` for a row
    that does not read (its row before deleted by hand, a damaged frame; its error names
    the ``seq``): an export leaves it out, so that the verifier reports the gap
    (``deleted``) instead of the export failing. The caller logs what it leaves out."""
    out: list[str | Unreadable] = []
    before: tuple[int, Any, str] | None = None
    for i, row in enumerate(rows):
        if i >= skip:
            near = before is not None and before[0] == row[0] - 1
            try:
                out.append(text_with(row[1], before[2] if near else None,  # type: ignore[index]
                                     before[1] if near else None))  # type: ignore[index]
            except EventUnreadable as exc:
                exc.seq = row[0]
                out.append(Unreadable(exc))
        before = row
    return out


def document(value: str | Unreadable, *, tenant: str | None = None, seq: int | None = None,
             digest: str | None = None) -> dict[str, Any]:
    """The event body (a JSON object) of a value selected as ``audit_events.body`` or
    through :func:`lenient`: for a reader whose answer depends on the event, so that it
    fails closed (nothing is allowed on the basis of a record that does not read).

    ``digest``: the row's ``hash`` column; given, the text must hash to it (a record an
    authorization answer rests on is checked whole, not only decodable). ``tenant`` and
    ``seq`` only name the event in the error (for the log).

    Raises:
        EventUnreadable: ``value`` is :class:`Unreadable`, its text is not a JSON object,
            or it does not hash to ``digest``.
    """
    if isinstance(value, Unreadable):
        error = value.error
        error.tenant, error.seq = tenant, seq
        raise error
    try:
        body = json.loads(value)
    except ValueError as exc:
        raise EventUnreadable("audit event text is not JSON", tenant=tenant,
                              seq=seq) from exc
    if not isinstance(body, dict):
        raise EventUnreadable("audit event text is not a JSON object", tenant=tenant, seq=seq)
    if digest is not None and hash_bytes(value.encode()) != digest:
        raise EventUnreadable("audit event text does not hash to its row's hash",
                              tenant=tenant, seq=seq)
    return body


def readable(value: str | Unreadable, *, tenant: str, seq: int, reader: str
             ) -> dict[str, Any] | None:
    """:func:`document`, or ``None`` with a warning logged (``reader`` leaves the event
    out): for a reader whose answer stays true without the event (a listing, a report
    that counts what it left out)."""
    try:
        return document(value, tenant=tenant, seq=seq)
    except EventUnreadable as exc:
        note_left_out(exc, reader)
        return None


def note_left_out(error: EventUnreadable, reader: str) -> None:
    """Log (warning) that ``reader`` left out the event of ``error``."""
    log.warning("audit event %s does not read (%s); left out of %s", error.where(),
                error.reason, reader)


class EventRead(ColumnElement[str]):
    """``audit_events.body`` as selected: for forms 4–6, with the row before it (see the
    module docstring); rendered per dialect below."""

    __visit_name__ = "event_read"
    inherit_cache = True
    # The type is part of the statement cache key: selected with another type (lenient()
    # or RawBlob), the same SQL has other result processors.
    _traverse_internals = [("body", InternalTraversal.dp_clauseelement),
                           ("tenant", InternalTraversal.dp_clauseelement),
                           ("seq", InternalTraversal.dp_clauseelement),
                           ("type", InternalTraversal.dp_type)]

    def __init__(self, body: Any, tenant: Any, seq: Any, type_: Any) -> None:
        self.body, self.tenant, self.seq, self.type = body, tenant, seq, type_

    @property
    def _from_objects(self) -> list[Any]:
        return list(self.body._from_objects)


#: ``(blob literal, concatenation wrapper)`` per dialect.
_SQLITE = ("x'{}'", "CAST({} AS BLOB)")
_POSTGRESQL = ("'\\x{}'::bytea", "{}")


def _render(element: EventRead, compiler: SQLCompiler, blob: str, wrap: str,
            **kw: Any) -> str:
    inner = {k: v for k, v in kw.items()
             if k not in ("add_to_result_map", "within_columns_clause",
                          "within_label_clause", "render_label_as_label")}
    body = compiler.process(element.body, **inner)
    tenant = compiler.process(element.tenant, **inner)
    seq = compiler.process(element.seq, **inner)

    def lit(byte: int) -> str:
        return blob.format(f"{byte:02x}")

    def before(what: str) -> str:
        return (f"coalesce((SELECT {lit(1)} || {what} FROM audit_events AS event_before "
                f"WHERE event_before.tenant = {tenant} AND event_before.seq = {seq} - 1 "
                f"AND length(event_before.hash) = 32), {lit(0)})")

    own = wrap.format(f"{lit(_READ_OWN)} || {before('event_before.hash')} || {body}")
    tail = wrap.format(
        f"{lit(_READ_TAIL)} || {before('event_before.hash || event_before.body')}")
    return (f"CASE WHEN substr({body}, 1, 1) IN ({lit(V4_PAIR)}, {lit(V6_SINGLE)}) "
            f"THEN {own} WHEN {body} = {lit(V5_TAIL)} THEN {tail} ELSE {body} END")


@compiles(EventRead)
def _render_default(element: EventRead, compiler: SQLCompiler, **kw: Any) -> str:
    return _render(element, compiler, *_POSTGRESQL, **kw)


@compiles(EventRead, "sqlite")
def _render_sqlite(element: EventRead, compiler: SQLCompiler, **kw: Any) -> str:
    return _render(element, compiler, *_SQLITE, **kw)


def bind(value: bytes | str | None) -> bytes | None:
    """What :class:`EventBody` stores for ``value``: a stored form as it is (what the
    chain packed), a text in form 1."""
    if isinstance(value, str):
        return compressed.compress(value.encode())
    return value


class EventBody(TypeDecorator[str]):
    """``audit_events.body``: written as the stored bytes the chain packed
    (:func:`pack_single`, :func:`pack_pair`; a ``str`` is stored in form 1), read as the
    event's canonical text through :class:`EventRead`."""

    impl = RawBlob
    cache_ok = True

    def process_bind_param(self, value: bytes | str | None, dialect: Dialect) -> bytes | None:
        return bind(value)

    def column_expression(self, colexpr: Any) -> Any:
        table = getattr(colexpr, "table", None)
        columns = getattr(table, "c", None)
        if columns is None or "tenant" not in columns or "seq" not in columns:
            return colexpr  # not the table's own column: forms 4-6 are then refused
        return EventRead(colexpr, columns.tenant, columns.seq, self)

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        """The event's text. Raises :class:`EventUnreadable` for one that does not read
        (failing the whole result: select :func:`lenient` to carry on past it)."""
        return None if value is None else text_of(value)


class _LenientBody(EventBody):
    """:class:`EventBody` whose reads give :class:`Unreadable` instead of raising."""

    cache_ok = True

    def process_result_value(self, value: Any, dialect: Dialect  # type: ignore[override]
                             ) -> str | Unreadable | None:
        if value is None:
            return None
        try:
            return text_of(value)
        except EventUnreadable as exc:
            return Unreadable(exc)


_LENIENT = _LenientBody()


def lenient(column: Any, name: str = "body") -> Any:
    """``audit_events.body`` (``column``) selected so that each value is the event's text
    or an :class:`Unreadable` marker, labelled ``name``: for a reader that goes on past an
    event that does not read (then :func:`readable`, or :func:`document` to fail closed).

    Raises:
        ValueError: ``column`` is not a column of a table with ``tenant`` and ``seq``.
    """
    columns = getattr(getattr(column, "table", None), "c", None)
    if columns is None or "tenant" not in columns or "seq" not in columns:
        raise ValueError("lenient() reads audit_events.body, a column of its table")
    return EventRead(column, columns.tenant, columns.seq, _LENIENT).label(name)
