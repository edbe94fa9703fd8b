"""A ``sha256:<64 hex>`` text column stored as its 32 bytes (issue 20, facts once).

Hash texts are 71 characters; the digest is 32 bytes. :class:`Sha256Digest` stores a
value of exactly that form (lower-case hex, as :func:`cosigner.core.canonical.hash_bytes`
writes it) as the 32 raw bytes, and reads give the same text back. Any other text is
stored as its UTF-8 bytes behind a ``0x00`` byte (or ``0x01 0x01`` where that would be
32 bytes long, so it is never read as a digest): what is read is always exactly what
was written. SQLite BLOB / PostgreSQL ``bytea`` (migration ``0020_s5store_facts_once``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from cosigner.db.driver_types import RawBlob

PREFIX = "sha256:"


def pack(value: str) -> bytes:
    """The stored bytes of a hash text (32 bytes for ``sha256:`` + 64 lower-case hex)."""
    if len(value) == 71 and value.startswith(PREFIX):
        hex_digits = value[7:]
        try:
            raw = bytes.fromhex(hex_digits)
        except ValueError:
            raw = b""
        # fromhex also reads upper case and skips spaces: the digest is kept only when
        # its lower-case spelling is the text (32 bytes back to exactly those 64 digits).
        if raw.hex() == hex_digits:
            return raw
    text = b"\x00" + value.encode()
    return text if len(text) != 32 else b"\x01\x01" + value.encode()  # never 32 long


def bind(value: str | None) -> bytes | None:
    """What a :class:`Sha256Digest` column stores for ``value`` (``None`` stays ``None``)."""
    return None if value is None else pack(value)


def unpack(stored: bytes | bytearray | memoryview | str) -> str:
    """The text that :func:`pack` stored (a pre-0020 text value as it is)."""
    if isinstance(stored, str):
        return stored
    data = bytes(stored)
    if len(data) == 32:
        return PREFIX + data.hex()
    if data[:1] == b"\x00":
        return data[1:].decode()
    if data[:1] == b"\x01":
        return data[2:].decode()
    return data.decode()  # text stored as bytes before the conversion


class Sha256Digest(TypeDecorator[str]):
    """A hash text column stored as the digest's bytes; reads give ``str``."""

    impl = RawBlob
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> bytes | None:
        return bind(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else unpack(value)
