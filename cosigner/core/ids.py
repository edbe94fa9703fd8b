"""Time-ordered identifiers (UUIDv7, RFC 9562) for rows that grow with the log.

Decision, approval, permit (``jti``) and delivery ids are primary or indexed keys of
tables that only grow. A random UUIDv4 scatters consecutive inserts over the whole
B-tree (each decision dirties ~5 pages); a UUIDv7 starts with the millisecond time, so
inserts go to the right edge of each index (issue 20). The ids stay opaque strings on
the wire: nothing parses or orders by them. ``uuid_utils`` (Rust) generates them: Python
3.11 has no ``uuid.uuid7``, and the generator is ~15× cheaper than ``str(uuid4())``.
"""

from __future__ import annotations

from uuid_utils import uuid7


def new_id() -> str:
    """A new id: a UUIDv7 in its 36-character hyphenated form."""
    return str(uuid7())


def new_hex_id() -> str:
    """A new id: a UUIDv7 as 32 lowercase hex digits (permit ``jti``)."""
    return uuid7().hex
