"""Rows of one table turned into the driver's values, by one function compiled per table.

SQLAlchemy's bind processing calls a chain of closures per value (the
``TypeDecorator.process`` wrapper around ``process_bind_param``, SQLite's ``DATETIME``
formatting through a ``%`` format and a dict, the JSON processor's ``NULL`` checks). The
group commit's raw inserts (:mod:`cosigner.db.raw_insert`, :mod:`cosigner.db.raw_pg`)
encode a row instead with one generated function per ``(dialect, table, keys)``: a tuple
display holding, per column, the call that processing ends in (:func:`table_encoders`; the
source is built from :func:`value_plan`, one :class:`Plan` per column):

* ``Sha256Digest``, ``CompressedText``, ``CompressedJSON``, ``ResponseJSON``,
  ``EventBody`` (any dialect; their ``impl`` has no processor): the module function
  their ``process_bind_param`` itself calls (:func:`cosigner.db.digest.pack`,
  :func:`cosigner.db.compressed.bind_text`, :func:`cosigner.db.event_row.bind` …),
  ``None`` kept inline;
* :mod:`cosigner.db.sqlite_compact` types (ids, instants): their packing on SQLite, the
  plain type's processor elsewhere;
* SQLite ``DATETIME`` in its default storage format: ``datetime.isoformat`` cut after
  the microseconds (the same wall-clock fields, zero-padded alike) for plain ``datetime``
  values with no or a fixed-offset zone; anything else through SQLAlchemy's processor;
* SQLite ``JSON`` with the engine's serializer: a ``list`` or ``dict`` value serialized
  directly (SQLAlchemy's ``NULL`` handling only concerns other values, which take its
  processor);
* ``decisions.response`` beside its row's id, request id, args hash and policy revision:
  stored form 3, a difference from those columns (:mod:`cosigner.db.response_row`);
* any other column: SQLAlchemy's own processor, or the value as is when it has none.

Values one batch repeats are packed once (:class:`_Memo`): a decision's id sits in five
of its rows, the policy revision in every decision of the batch. An instant column's
integer is computed each time from the datetime's fields (:func:`_micros`: cheaper than
its memo's tuple key and hash).

tests/db/test_row_encoders.py checks with hypothesis that every column's encoding is
exactly what SQLAlchemy's bind processing gives, on both dialects, and that the rows'
encoding is the columns' encoding laid out row by row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, NamedTuple
from weakref import WeakKeyDictionary

from sqlalchemy import Column, Table
from sqlalchemy.dialects.sqlite import DATETIME as SQLITE_DATETIME
from sqlalchemy.engine import Dialect
from sqlalchemy.types import JSON

from cosigner.db import compressed, digest, event_row, response_row, sqlite_compact

#: A column's values (in row order) → the driver's values.
ColumnEncoder = Callable[[Sequence[Any]], list[Any]]

#: Exact column type → the function its ``process_bind_param`` calls on a value that is
#: not ``None`` (``None`` binds as ``None``).
_VALUE_ENCODERS: dict[type, Callable[[Any], Any]] = {
    digest.Sha256Digest: digest.pack,
    compressed.CompressedText: compressed.bind_text,
    compressed.CompressedJSON: compressed.bind_json,
    compressed.ResponseJSON: compressed.bind_response,
    event_row.EventBody: event_row.bind,
}
_SQLITE_DATETIME_FORMAT = SQLITE_DATETIME._storage_format  # noqa: SLF001 - the default


@dataclass(frozen=True, slots=True)
class Plan:
    """How one column's value becomes the driver's: ``kind`` ``"as is"`` (no processor),
    ``"value"`` (``fn(value)``, ``None`` kept), ``"process"`` (``fn(value)`` for every
    value, ``None`` included), ``"json"`` (``fn`` for a ``list``/``dict``, ``other`` for
    the rest) or ``"response"`` (:func:`cosigner.db.response_row.bind` with the row's
    :data:`~cosigner.db.response_row.REF_COLUMNS`)."""

    kind: str
    fn: Callable[..., Any] | None = None
    other: Callable[[Any], Any] | None = None


class _Memo(dict[Any, Any]):
    """Results of one packing function by value, bounded (cleared when full): a batch's
    rows repeat their decisions' ids, instants and hashes."""

    __slots__ = ("fn",)
    MAX = 4096

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        super().__init__()
        self.fn = fn

    def __missing__(self, value: Any) -> Any:
        found = self.fn(value)
        if len(self) >= self.MAX:
            self.clear()
        self[value] = found
        return found


def _instant_key(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``fn`` of a datetime remembered under ``(value, its zone)`` when the zone is none
    or fixed: equal datetimes with an equal fixed zone (or none) have the same wall-clock
    fields, which is all SQLite's text and integer forms hold."""
    memo = _Memo(lambda key: fn(key[0]))

    def encode(value: Any) -> Any:
        if type(value) is datetime:
            zone = value.tzinfo
            if zone is None or type(zone) is timezone:
                return memo[(value, zone)]
        return fn(value)

    return encode


#: ``date(1970, 1, 1).toordinal()``
_EPOCH_ORDINAL = 719163


def _micros(value: Any) -> Any:
    """:func:`cosigner.db.sqlite_compact.micros` (an instant's wall-clock fields as
    microseconds since 1970-01-01), for a plain ``datetime`` from its fields: 0.2 µs
    instead of 0.8 (``replace`` and a ``timedelta``), so it is cheaper than remembering
    it (tests/db/test_row_encoders.py checks it is the same number, hypothesis)."""
    if type(value) is datetime:
        return ((((value.toordinal() - _EPOCH_ORDINAL) * 86400 + value.hour * 3600
                  + value.minute * 60 + value.second) * 1_000_000) + value.microsecond)
    return sqlite_compact.micros(value)


#: The packings shared by every table's encoder (a decision's id is packed once for its
#: decision, permit, call input and event rows).
_MICROS = _micros
_SHARED: dict[Callable[[Any], Any], Callable[[Any], Any]] = {
    fn: _Memo(fn).__getitem__ for fn in (sqlite_compact.pack_uuid, sqlite_compact.pack_hex)}


def value_plan(dialect: Dialect, column: Column[Any]) -> Plan:
    """How ``column``'s values are bound on ``dialect`` (see the module docstring)."""
    kind = type(column.type)
    if isinstance(column.type, sqlite_compact._Compact):  # noqa: SLF001 - this package's
        if dialect.name == "sqlite":
            if kind is sqlite_compact.Instant:
                return Plan("value", _MICROS)
            pack = type(column.type)._bind  # noqa: SLF001
            return Plan("value", _SHARED.get(pack, pack))
        process = column.type.encoder(dialect)
        return Plan("as is") if process is None else Plan("process", process)
    impl = column.type.dialect_impl(dialect)
    process = impl.bind_processor(dialect)
    if process is None:
        return Plan("as is")
    value_encoder = _VALUE_ENCODERS.get(kind)
    if value_encoder is not None and impl.impl_instance.bind_processor(dialect) is None:  # type: ignore[attr-defined]
        return Plan("value", value_encoder)
    if (isinstance(impl, SQLITE_DATETIME)
            and impl._storage_format == _SQLITE_DATETIME_FORMAT):  # noqa: SLF001
        return Plan("process", _instant_key(_sqlite_datetime(process)))
    serializer = getattr(dialect, "_json_serializer", None)
    if (dialect.name == "sqlite" and isinstance(impl, JSON) and serializer is not None
            and impl._str_impl.bind_processor(dialect) is None):  # noqa: SLF001
        return Plan("json", serializer, process)
    return Plan("process", process)


def _sqlite_datetime(process: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """SQLite ``DATETIME`` text (``YYYY-MM-DD HH:MM:SS.ffffff``, the wall-clock fields
    whatever the zone, as SQLAlchemy writes them)."""

    def encode(value: Any) -> Any:
        if type(value) is datetime:
            zone = value.tzinfo
            if zone is None or type(zone) is timezone:
                # isoformat writes the year %04d and the other fields %02d (the
                # microseconds %06d), as the format does; the offset comes after.
                return value.isoformat(" ", "microseconds")[:26]
        return process(value)

    return encode


def _plans(dialect: Dialect, table: Table, keys: tuple[str, ...]) -> list[Plan]:
    plans = [value_plan(dialect, table.columns[name]) for name in keys]
    if (table.name == "decisions" and "response" in keys
            and all(name in keys for name in response_row.REF_COLUMNS)):
        plans[keys.index("response")] = Plan("response", response_row.bind)
    return plans


class TableEncoders(NamedTuple):
    """The generated encoders of one table's rows holding given keys, on one dialect."""

    #: One row → its driver values, in the keys' order.
    row: Callable[[dict[str, Any]], tuple[Any, ...]]
    #: Rows → one tuple of driver values per row (SQLite's ``executemany``).
    rows: Callable[[Sequence[dict[str, Any]]], list[tuple[Any, ...]]]


def _compile(table: Table, keys: tuple[str, ...], plans: list[Plan]) -> TableEncoders:
    """The generated ``encode(row)`` and ``encode_rows(rows)`` (one tuple display, no loop
    or call per column beyond the packing itself)."""
    names: dict[str, Any] = {}
    parts: list[str] = []
    for i, (key, plan) in enumerate(zip(keys, plans, strict=True)):
        value = f"row[{key!r}]"
        if plan.kind == "as is":
            parts.append(value)
            continue
        names[f"f{i}"] = plan.fn
        if plan.kind == "value":
            parts.append(f"(None if (v{i} := {value}) is None else f{i}(v{i}))")
        elif plan.kind == "process":
            parts.append(f"f{i}({value})")
        elif plan.kind == "json":
            names[f"o{i}"] = plan.other
            parts.append(f"(f{i}(v{i}) if (t{i} := type(v{i} := {value})) is list "
                         f"or t{i} is dict else o{i}(v{i}))")
        else:  # response: its row's reference texts beside it
            refs = ", ".join(f"row[{name!r}]" for name in response_row.REF_COLUMNS)
            parts.append(f"f{i}({value}, ({refs}))")
    row = f"({', '.join(parts)},)"
    source = (f"def encode(row):\n    return {row}\n\n"
              f"def encode_rows(rows):\n    return [{row} for row in rows]\n")
    exec(compile(source, f"<encoder of {table.name} rows>", "exec"), names)  # noqa: S102 - built above from the table's own column names
    return TableEncoders(names["encode"], names["encode_rows"])


#: Per dialect object (weakly: a dialect dropped with its engine takes its encoders along,
#: and a new dialect at a reused address never meets another dialect's encoders).
_ENCODERS: WeakKeyDictionary[Dialect, dict[tuple[str, tuple[str, ...]], TableEncoders]] = (
    WeakKeyDictionary())


def table_encoders(dialect: Dialect, table: Table, keys: tuple[str, ...]) -> TableEncoders:
    """The encoders of ``table``'s rows holding ``keys`` on ``dialect`` (built once)."""
    per_dialect = _ENCODERS.get(dialect)
    if per_dialect is None:
        per_dialect = _ENCODERS[dialect] = {}
    found = per_dialect.get((table.name, keys))
    if found is None:
        found = per_dialect[(table.name, keys)] = _compile(
            table, keys, _plans(dialect, table, keys))
    return found


def column_encoder(dialect: Dialect, column: Column[Any]) -> ColumnEncoder | None:
    """What turns ``column``'s values into the driver's on ``dialect`` (``None``: they go
    as they are, SQLAlchemy has no processor for them)."""
    plan = value_plan(dialect, column)
    fn, other = plan.fn, plan.other
    if plan.kind == "as is" or fn is None:
        return None
    if plan.kind == "value":
        return lambda values: [None if v is None else fn(v) for v in values]
    if plan.kind == "json":
        assert other is not None
        return lambda values: [fn(v) if type(v) is list or type(v) is dict else other(v)
                               for v in values]
    return lambda values: [fn(v) for v in values]
