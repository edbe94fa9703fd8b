"""Ids and instants stored in fewer bytes on SQLite (issue 20, migration 0021).

An allow decision stores its decision id (a UUID, 36 characters) ~10 times and its
permit id (32 hex digits) ~4 times, in rows and index entries, and its instants (SQLite
``DATETIME`` text, 26 characters) 7 times. On SQLite these types store:

* :class:`UuidText`: a UUID in its canonical text form (lower-case ``8-4-4-4-12``) as
  its 16 bytes;
* :class:`HexId`: 32 lower-case hex digits (a permit id) as their 16 bytes;
* any other text, in both: its UTF-8 bytes behind a ``0x00`` byte (``0x01 0x01`` where
  that would be 16 bytes long, so it is never read as an id). Reads give back exactly
  the text that was written (tests/db/test_compact_storage.py, hypothesis);
* :class:`Instant` (a ``DateTime(timezone=True)``): the wall-clock fields SQLAlchemy's
  SQLite ``DATETIME`` would have written as text, as an integer count of microseconds
  since 1970-01-01 (8 bytes); reads give the same naive ``datetime`` as before.

Order is kept where it matters: 16-byte ids compare (``memcmp``) as their canonical
texts do, integers as the instants. Values written before migration 0021 (TEXT) read
back unchanged. PostgreSQL keeps its ``varchar`` and ``timestamptz`` columns: these
types pass values through there, exactly as the plain types did.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import DateTime, String
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from cosigner.db.driver_types import RawBlob, RawInteger

_EPOCH = datetime(1970, 1, 1)
_SQLITE = sqlite.dialect()
_PARSE_TEXT = sqlite.DATETIME().result_processor(_SQLITE, None)  # type: ignore[no-untyped-call]


def _other(value: str) -> bytes:
    text = b"\x00" + value.encode()
    return text if len(text) != 16 else b"\x01\x01" + value.encode()  # never 16 long


def pack_uuid(value: str) -> bytes:
    """The stored bytes of an id text (16 bytes for a canonical lower-case UUID)."""
    if len(value) == 36 and value[8] == value[13] == value[18] == value[23] == "-":
        digits = value[:8] + value[9:13] + value[14:18] + value[19:23] + value[24:]
        try:
            raw = bytes.fromhex(digits)
        except ValueError:
            raw = b""
        if len(raw) == 16 and raw.hex() == digits:  # fromhex also reads upper case, spaces
            return raw
    return _other(value)


def pack_hex(value: str) -> bytes:
    """The stored bytes of an id text (16 bytes for 32 lower-case hex digits)."""
    if len(value) == 32:
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raw = b""
        if len(raw) == 16 and raw.hex() == value:
            return raw
    return _other(value)


def _unpack_other(data: bytes) -> str:
    if data[:1] == b"\x01":
        return data[2:].decode()
    return data[1:].decode()


def unpack_uuid(stored: bytes | bytearray | memoryview | str) -> str:
    """The text that :func:`pack_uuid` stored (a pre-0021 text as it is)."""
    if isinstance(stored, str):
        return stored
    data = bytes(stored)
    if len(data) == 16:
        h = data.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return _unpack_other(data)


def unpack_hex(stored: bytes | bytearray | memoryview | str) -> str:
    """The text that :func:`pack_hex` stored (a pre-0021 text as it is)."""
    if isinstance(stored, str):
        return stored
    data = bytes(stored)
    return data.hex() if len(data) == 16 else _unpack_other(data)


def bind_uuid(value: str | None) -> bytes | None:
    return None if value is None else pack_uuid(value)


def bind_hex(value: str | None) -> bytes | None:
    return None if value is None else pack_hex(value)


def micros(value: datetime | date) -> int:
    """The wall-clock fields of ``value`` (its zone ignored, as SQLite ``DATETIME`` text
    ignores it; a ``date`` at midnight) as microseconds since 1970-01-01."""
    if isinstance(value, datetime):
        delta = value.replace(tzinfo=None) - _EPOCH
    elif isinstance(value, date):
        delta = datetime(value.year, value.month, value.day) - _EPOCH
    else:
        raise TypeError("SQLite DateTime type only accepts Python datetime and date "
                        "objects as input.")
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def bind_instant(value: datetime | date | None) -> int | None:
    return None if value is None else micros(value)


def instant(stored: int | str) -> datetime:
    """The naive ``datetime`` that :func:`micros` stored (pre-0021 text parsed as
    SQLAlchemy's SQLite ``DATETIME`` parses it)."""
    if isinstance(stored, str):
        parsed: datetime = _PARSE_TEXT(stored)  # type: ignore[misc,assignment]
        return parsed
    return _EPOCH + timedelta(microseconds=stored)


class _Compact(TypeDecorator[Any]):
    """Stored compactly on SQLite (``sqlite_impl``), as ``impl`` elsewhere."""

    cache_ok = True
    _bind: Callable[[Any], Any]
    _read: Callable[[Any], Any]
    _sqlite_impl: type[TypeEngine[Any]] = RawBlob

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(self._sqlite_impl())
        return dialect.type_descriptor(self.impl_instance)

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name == "sqlite" and value is not None:
            return type(self)._bind(value)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name == "sqlite" and value is not None:
            return type(self)._read(value)
        return value

    def encoder(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        """What the group commit's raw inserts map over a column of this type on
        ``dialect`` (:mod:`cosigner.db.row_encoders`): the SQLite packing, or what the
        plain type binds with elsewhere (``None``: values as they are)."""
        if dialect.name == "sqlite":
            return type(self)._bind_or_none
        return self.load_dialect_impl(dialect).bind_processor(dialect)

    @classmethod
    def _bind_or_none(cls, value: Any) -> Any:
        return None if value is None else cls._bind(value)


class UuidText(_Compact):
    """A UUID text column (a decision id): 16 bytes on SQLite; reads give ``str``."""

    impl = String(36)
    cache_ok = True
    _bind = staticmethod(pack_uuid)
    _read = staticmethod(unpack_uuid)


class HexId(_Compact):
    """A 32-hex-digit text column (a permit id): 16 bytes on SQLite; reads give ``str``."""

    impl = String(64)
    cache_ok = True
    _bind = staticmethod(pack_hex)
    _read = staticmethod(unpack_hex)


class Instant(_Compact):
    """``DateTime(timezone=True)``: microseconds since 1970 on SQLite (reads give the
    same naive ``datetime`` as SQLite ``DATETIME`` text did), ``timestamptz`` elsewhere."""

    impl = DateTime(timezone=True)
    cache_ok = True
    _sqlite_impl = RawInteger
    _bind = staticmethod(micros)
    _read = staticmethod(instant)
