"""Column types that hand the driver's values through both ways, unconverted.

The compact column types (:mod:`cosigner.db.compressed`, :mod:`cosigner.db.digest`,
:mod:`cosigner.db.sqlite_compact`) decide themselves what a stored value means: a row
written before their migration may still hold TEXT, which must reach their reader as the
``str`` the driver gives (SQLAlchemy's ``LargeBinary`` would wrap it in ``bytes()``).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, LargeBinary
from sqlalchemy.engine import Dialect


class _DriverValues:
    """No bind or result processing: the driver's values as they are."""

    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> None:
        return None

    def result_processor(self, dialect: Dialect, coltype: object) -> None:
        return None


class RawBlob(_DriverValues, LargeBinary):
    """BLOB / ``bytea``; a TEXT value of an older row reads as ``str``."""


class RawInteger(_DriverValues, BigInteger):
    """INTEGER / ``bigint``; a TEXT value of an older row reads as ``str``."""
