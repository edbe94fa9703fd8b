"""Rows of one table turned into the driver's values, one encoder compiled per column.

SQLAlchemy's bind processing calls a chain of closures per value (the
``TypeDecorator.process`` wrapper around ``process_bind_param``, SQLite's ``DATETIME``
formatting through a ``%`` format and a dict, the JSON processor's ``NULL`` checks). The
group commit's raw inserts (:mod:`cosigner.db.raw_insert`, :mod:`cosigner.db.raw_pg`)
encode whole columns instead, with the function that processing ends in:

* ``Sha256Digest``, ``CompressedText``, ``CompressedJSON``, ``ResponseJSON`` (any dialect;
  their ``impl`` has no processor): the module function their ``process_bind_param``
  itself calls (:func:`cosigner.db.digest.bind`, :func:`cosigner.db.compressed.bind_text`
  …), mapped over the column;
* :mod:`cosigner.db.sqlite_compact` types (ids, instants): their packing on SQLite, the
  plain type's processor elsewhere;
* SQLite ``DATETIME`` in its default storage format: ``datetime.isoformat`` cut after
  the microseconds (the same wall-clock fields, zero-padded alike) for plain ``datetime``
  values with no or a fixed-offset zone, remembered for the instants that repeat (one
  decision's rows and events share one); anything else through SQLAlchemy's processor;
* SQLite ``JSON`` with the engine's serializer: a ``list`` or ``dict`` value serialized
  directly (SQLAlchemy's ``NULL`` handling only concerns other values, which take its
  processor);
* ``decisions.response`` beside its row's id, request id, args hash and policy revision:
  stored form 3, a difference from those columns (:mod:`cosigner.db.response_row`);
* any other column: SQLAlchemy's own processor, or the value as is when it has none.

tests/db/test_row_encoders.py checks with hypothesis that every encoder gives exactly
what SQLAlchemy's bind processing gives, on both dialects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from operator import itemgetter
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Column, Table
from sqlalchemy.dialects.sqlite import DATETIME as SQLITE_DATETIME
from sqlalchemy.engine import Dialect
from sqlalchemy.types import JSON

from cosigner.db import compressed, digest, response_row, sqlite_compact

#: A column's values (in row order) → the driver's values.
ColumnEncoder = Callable[[Sequence[Any]], list[Any]]
#: ``rows`` → one list of driver values per key, in the keys' order.
RowsEncoder = Callable[[Sequence[dict[str, Any]]], list[list[Any]]]

#: Exact column type → the function its ``process_bind_param`` calls (None → None).
_VALUE_ENCODERS: dict[type, Callable[[Any], Any]] = {
    digest.Sha256Digest: digest.bind,
    compressed.CompressedText: compressed.bind_text,
    compressed.CompressedJSON: compressed.bind_json,
    compressed.ResponseJSON: compressed.bind_response,
}
_SQLITE_DATETIME_FORMAT = SQLITE_DATETIME._storage_format  # noqa: SLF001 - the default
#: Per dialect object (weakly: a dialect dropped with its engine takes its encoders along,
#: and a new dialect at a reused address never meets another dialect's encoders).
_ENCODERS: WeakKeyDictionary[Dialect, dict[tuple[str, tuple[str, ...]], RowsEncoder]] = (
    WeakKeyDictionary())


def rows_encoder(dialect: Dialect, table: Table, keys: tuple[str, ...]) -> RowsEncoder:
    """The encoder of ``table``'s rows holding ``keys`` on ``dialect`` (built once)."""
    per_dialect = _ENCODERS.get(dialect)
    if per_dialect is None:
        per_dialect = _ENCODERS[dialect] = {}
    found = per_dialect.get((table.name, keys))
    if found is None:
        found = per_dialect[(table.name, keys)] = _compile(dialect, table, keys)
    return found


def _compile(dialect: Dialect, table: Table, keys: tuple[str, ...]) -> RowsEncoder:
    encoders = [column_encoder(dialect, table.columns[name]) for name in keys]
    get = itemgetter(*keys)
    single = len(keys) == 1
    if (table.name == "decisions" and "response" in keys
            and all(name in keys for name in response_row.REF_COLUMNS)):
        return _with_response_row(keys, encoders, get)

    def encode(rows: Sequence[dict[str, Any]]) -> list[list[Any]]:
        columns: list[Sequence[Any]]
        if single:
            columns = [[get(row) for row in rows]]
        else:
            columns = list(zip(*map(get, rows), strict=True)) or [() for _ in keys]
        return [list(values) if encoder is None else encoder(values)
                for encoder, values in zip(encoders, columns, strict=True)]

    return encode


def _with_response_row(keys: tuple[str, ...], encoders: list[ColumnEncoder | None],
                       get: Callable[[dict[str, Any]], tuple[Any, ...]]) -> RowsEncoder:
    """``decisions`` rows: the response in stored form 3, packed against its own row's
    id, request id, args hash and policy revision (:mod:`cosigner.db.response_row`)."""
    at = keys.index("response")
    refs = itemgetter(*response_row.REF_COLUMNS)
    encoders = [None if i == at else encoder for i, encoder in enumerate(encoders)]
    bind = response_row.bind

    def encode(rows: Sequence[dict[str, Any]]) -> list[list[Any]]:
        columns = list(zip(*map(get, rows), strict=True)) or [() for _ in keys]
        out = [list(values) if encoder is None else encoder(values)
               for encoder, values in zip(encoders, columns, strict=True)]
        out[at] = [bind(row["response"], refs(row)) for row in rows]
        return out

    return encode


def column_encoder(dialect: Dialect, column: Column[Any]) -> ColumnEncoder | None:
    """What turns ``column``'s values into the driver's on ``dialect`` (``None``: they go
    as they are, SQLAlchemy has no processor for them)."""
    if isinstance(column.type, sqlite_compact._Compact):  # noqa: SLF001 - this package's
        packing = column.type.encoder(dialect)
        return None if packing is None else _mapped(packing)
    impl = column.type.dialect_impl(dialect)
    process = impl.bind_processor(dialect)
    if process is None:
        return None
    value_encoder = _VALUE_ENCODERS.get(type(column.type))
    if value_encoder is not None and impl.impl_instance.bind_processor(dialect) is None:  # type: ignore[attr-defined]
        return _mapped(value_encoder)
    if (isinstance(impl, SQLITE_DATETIME)
            and impl._storage_format == _SQLITE_DATETIME_FORMAT):  # noqa: SLF001
        return _sqlite_datetimes(process)
    serializer = getattr(dialect, "_json_serializer", None)
    if (dialect.name == "sqlite" and isinstance(impl, JSON) and serializer is not None
            and impl._str_impl.bind_processor(dialect) is None):  # noqa: SLF001
        return _mapped(_json_values(serializer, process))
    return _mapped(process)


def _mapped(encode: Callable[[Any], Any]) -> ColumnEncoder:
    def encode_all(values: Sequence[Any]) -> list[Any]:
        return list(map(encode, values))
    return encode_all


def _json_values(serializer: Callable[[Any], Any], process: Callable[[Any], Any]
                 ) -> Callable[[Any], Any]:
    def encode(value: Any) -> Any:
        kind = type(value)
        return serializer(value) if kind is list or kind is dict else process(value)
    return encode


#: ``(datetime, its zone)`` → SQLite text: one batch's rows and events share their
#: decisions' instants (created, issued, each event's time). Equal datetimes with an equal
#: fixed zone (or none) have the same wall-clock fields, which is all the text holds.
_DATETIME_TEXTS: dict[tuple[datetime, Any], str] = {}
_DATETIME_TEXTS_MAX = 1024


def _sqlite_datetimes(process: Callable[[Any], Any]) -> ColumnEncoder:
    """SQLite ``DATETIME`` text (``YYYY-MM-DD HH:MM:SS.ffffff``, the wall-clock fields
    whatever the zone, as SQLAlchemy writes them)."""

    def encode(value: Any) -> Any:
        if type(value) is datetime:
            zone = value.tzinfo
            if zone is None or type(zone) is timezone:
                key = (value, zone)
                text = _DATETIME_TEXTS.get(key)
                if text is None:
                    if len(_DATETIME_TEXTS) >= _DATETIME_TEXTS_MAX:
                        _DATETIME_TEXTS.clear()
                    # isoformat writes the year %04d and the other fields %02d (the
                    # microseconds %06d), as the format does; the offset comes after.
                    text = _DATETIME_TEXTS[key] = value.isoformat(" ", "microseconds")[:26]
                return text
        return process(value)

    return _mapped(encode)
