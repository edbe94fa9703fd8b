"""Reading the decision log: filtered pages in stable ``seq`` order, checkpoints.

Pages are addressed by an opaque cursor (base64url of ``v1:<last seq>``); since ``seq`` is
the chain order and never reused, a page boundary is stable while events are appended. The
tenant always comes from the caller's credential, never from the cursor or a filter.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.audit.checkpoints import Checkpoint, row_to_checkpoint
from cosigner.core.errors import InvalidRequest
from cosigner.db import event_row
from cosigner.db.tables import audit_events
from cosigner.db.tables_audit import audit_checkpoints

MAX_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Query filters; ``None`` means "any". ``since`` inclusive, ``until`` exclusive (UTC)."""

    since: datetime | None = None
    until: datetime | None = None
    type: str | None = None
    tool: str | None = None
    effect: str | None = None
    run_id: str | None = None
    principal: str | None = None
    decision_id: str | None = None
    approval_id: str | None = None
    policy_id: str | None = None
    policy_version: str | None = None
    #: ``shadow``: only shadow-mode decisions (issue 18).
    mode: str | None = None


_EQUALITY = ("type", "tool", "effect", "run_id", "principal", "decision_id", "approval_id",
             "policy_id", "policy_version", "mode")


def utc(moment: datetime) -> datetime:
    """A naive datetime is read as UTC (SQLite returns them); aware ones are converted."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"v1:{seq}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The last seq of the previous page; raises :class:`InvalidRequest` (``invalid_cursor``)."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        version, _, seq = text.partition(":")
        if version != "v1" or not seq.isdigit():
            raise ValueError(text)
        return int(seq)
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequest("cursor is not valid", code="invalid_cursor") from exc


def filtered(query: Select[Any], tenant: str, where: EventFilter) -> Select[Any]:
    """``query`` restricted to ``tenant`` and the filter."""
    query = query.where(audit_events.c.tenant == tenant)
    if where.since is not None:
        query = query.where(audit_events.c.time >= utc(where.since))
    if where.until is not None:
        query = query.where(audit_events.c.time < utc(where.until))
    for name in _EQUALITY:
        value = getattr(where, name)
        if value is not None:
            query = query.where(audit_events.c[name] == value)
    return query


#: ``audit_events.body`` selected so that one event that does not read leaves the rest of
#: its page readable (:func:`cosigner.db.event_row.lenient`).
_BODY = event_row.lenient(audit_events.c.body)


async def query_events(conn: AsyncConnection, *, tenant: str, where: EventFilter,
                       cursor: str | None = None, limit: int = 100
                       ) -> tuple[list[dict[str, Any]], str | None]:
    """One page of ``tenant``'s events matching ``where``, in ``seq`` order.

    Returns ``(events, next_cursor)``; ``next_cursor`` is ``None`` on the last page.
    ``limit`` is 1..1000. Raises :class:`InvalidRequest` for a bad cursor or limit.

    An event that does not read (:class:`~cosigner.db.event_row.EventUnreadable`: the
    row before it deleted by hand, its stored bytes damaged) is left out of the page with
    a logged warning: a gap in ``seq``, as for a deleted row (the export leaves it out too
    and ``cosigner audit verify`` reports it), instead of every page holding it failing.
    The cursor still moves past it.
    """
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be 1..{MAX_LIMIT}", code="invalid_limit")
    query = filtered(select(audit_events.c.seq, _BODY, audit_events.c.hash), tenant, where)
    if cursor is not None:
        query = query.where(audit_events.c.seq > decode_cursor(cursor))
    rows = (await conn.execute(query.order_by(audit_events.c.seq).limit(limit + 1))).all()
    events = []
    for row in rows[:limit]:
        body = event_row.readable(row.body, tenant=tenant, seq=int(row.seq),
                                  reader="the events API")
        if body is not None:
            events.append({**body, "hash": row.hash})
    more = len(rows) > limit
    return events, encode_cursor(int(rows[limit - 1].seq)) if more else None


async def query_checkpoints(conn: AsyncConnection, *, tenant: str, after_seq: int = 0,
                            limit: int = 100) -> list[Checkpoint]:
    """``tenant``'s checkpoints with ``seq > after_seq``, oldest first (``limit`` 1..1000)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be 1..{MAX_LIMIT}", code="invalid_limit")
    rows = (await conn.execute(
        select(audit_checkpoints).where(audit_checkpoints.c.tenant == tenant,
                                        audit_checkpoints.c.seq > after_seq)
        .order_by(audit_checkpoints.c.seq).limit(limit))).all()
    return [row_to_checkpoint(row) for row in rows]


FILTER_NAMES = tuple(f.name for f in fields(EventFilter))
