"""Paged lists of approval requests: the approver's queue and the decided history.

Keyset paging (no offset): rows are ordered by ``(sort column, id)``, so the order is total
and stable while rows are added, and a page is read from an index whatever its depth. The
cursor is opaque text (base64url of ``{sort, desc, value, id, back}``); a cursor made for
another sort order is ignored (the list starts again). A cursor only says where to start
reading in the caller's own tenant, so a forged one shows nothing more.

Visibility is checked per row with :mod:`cosigner.approvals.eligibility` (the review rules
are code, not SQL), reading rows in batches until a page is full; at most
:data:`MAX_SCAN` rows are read for one page (a page may then be short, with a cursor to go
on). ``total`` counts what the caller would see, up to :data:`MAX_COUNT`.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.approvals import eligibility
from cosigner.approvals.requests import aware, expire_due
from cosigner.approvals.views import view
from cosigner.db.tables import permits
from cosigner.db.tables_approvals import approvals, reviews
from cosigner.identity.principals import Caller

if TYPE_CHECKING:
    from cosigner.context import AppContext

DECIDED = ("approved", "rejected", "expired", "cancelled")
#: Sort keys → columns. ``expires``: time left; ``decided``: history only.
SORTS = {"expires": approvals.c.expires_at, "created": approvals.c.created_at,
         "tool": approvals.c.tool, "decided": approvals.c.decided_at}
MIN_SIZE, MAX_SIZE = 10, 200
MAX_SCAN = 5000
MAX_COUNT = 10_000
#: Columns :func:`cosigner.approvals.eligibility.in_queue` needs (counting reads only these).
_SLIM = (approvals.c.id, approvals.c.run_id, approvals.c.tool, approvals.c.args_hash,
         approvals.c.status, approvals.c.expires_at, approvals.c.requirement,
         approvals.c.initiator, approvals.c.principal, approvals.c.opened_by)


@dataclass(frozen=True)
class Query:
    """What one list asks for. ``pending``: the queue; otherwise the decided history with
    ``statuses`` ⊆ :data:`DECIDED`, ``tool`` (exact name) and ``decided_from`` ≤
    ``decided_at`` < ``decided_before`` (UTC)."""

    pending: bool
    sort: str
    desc: bool
    size: int
    cursor: str | None = None
    statuses: tuple[str, ...] = DECIDED
    tool: str | None = None
    decided_from: datetime | None = None
    decided_before: datetime | None = None


@dataclass(frozen=True)
class Page:
    """One page: approval state objects (as ``GET /v1/approvals/{id}``, without permit
    tokens), cursors to the next and previous pages, and the bounded total."""

    items: list[dict[str, Any]]
    next_cursor: str | None
    prev_cursor: str | None
    total: int
    total_capped: bool


def clamp_size(size: int) -> int:
    """Page size bounded to :data:`MIN_SIZE`..:data:`MAX_SIZE`."""
    return max(MIN_SIZE, min(MAX_SIZE, size))


def encode_cursor(query: Query, value: Any, row_id: str, *, back: bool) -> str:
    text = value.isoformat() if isinstance(value, datetime) else value
    raw = json.dumps({"s": query.sort, "d": query.desc, "v": text, "i": row_id, "b": back},
                     separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(query: Query) -> tuple[Any, str, bool] | None:
    """``(value, id, back)`` of the query's cursor, or ``None`` (none, foreign or bad)."""
    if not query.cursor or len(query.cursor) > 2048:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(query.cursor + "=" * (-len(query.cursor) % 4)))
        if (not isinstance(data, dict) or data.get("s") != query.sort
                or data.get("d") is not query.desc or not isinstance(data.get("i"), str)
                or not isinstance(data.get("v"), str) or not isinstance(data.get("b"), bool)):
            return None
        value: Any = data["v"]
        if query.sort != "tool":  # an aware UTC time the database can hold, or no cursor
            value = datetime.fromisoformat(value)
            value = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
        return value, data["i"], data["b"]
    except (ValueError, OverflowError, binascii.Error, UnicodeDecodeError):
        return None


def _filtered(stmt: Select[Any], caller: Caller, query: Query) -> Select[Any]:
    stmt = stmt.where(approvals.c.tenant == caller.tenant)
    if query.pending:
        return stmt.where(approvals.c.status == "pending")
    stmt = stmt.where(approvals.c.status.in_(query.statuses), approvals.c.decided_at.is_not(None))
    if query.tool:
        stmt = stmt.where(approvals.c.tool == query.tool)
    if query.decided_from is not None:
        stmt = stmt.where(approvals.c.decided_at >= query.decided_from)
    if query.decided_before is not None:
        stmt = stmt.where(approvals.c.decided_at < query.decided_before)
    return stmt


def _ordered(stmt: Select[Any], query: Query, after: tuple[Any, str] | None,
             backward: bool) -> Select[Any]:
    column = SORTS[query.sort]
    desc = query.desc != backward  # reading backwards flips the order
    if after is not None:
        value, row_id = after
        if desc:
            stmt = stmt.where(or_(column < value, and_(column == value, approvals.c.id < row_id)))
        else:
            stmt = stmt.where(or_(column > value, and_(column == value, approvals.c.id > row_id)))
    if desc:
        return stmt.order_by(column.desc(), approvals.c.id.desc())
    return stmt.order_by(column.asc(), approvals.c.id.asc())


def _key(query: Query, row: Any) -> tuple[Any, str]:
    value = getattr(row, {"expires": "expires_at", "created": "created_at", "tool": "tool",
                          "decided": "decided_at"}[query.sort])
    return (aware(value) if isinstance(value, datetime) else value), row.id


async def _scan(conn: AsyncConnection, caller: Caller, query: Query, start: tuple[Any, str] | None,
                backward: bool, visible: Any) -> tuple[list[Any], tuple[Any, str] | None, bool]:
    """Up to ``size + 1`` visible rows from ``start``; the last key read; whether the scan
    stopped at :data:`MAX_SCAN` before the end."""
    found: list[Any] = []
    last, scanned = start, 0
    batch = max(query.size * 2, 50)
    while len(found) <= query.size:
        rows = (await conn.execute(_ordered(_filtered(select(approvals), caller, query),
                                            query, last, backward).limit(batch))).all()
        for row in rows:
            scanned += 1
            last = _key(query, row)
            if visible(row):
                found.append(row)
                if len(found) > query.size:
                    return found, last, False
        if len(rows) < batch:
            return found, last, False
        if scanned >= MAX_SCAN:
            return found, last, True
    return found, last, False


async def _count(conn: AsyncConnection, caller: Caller, query: Query, visible: Any
                 ) -> tuple[int, bool]:
    if caller.has_any(*eligibility.READERS):
        total = (await conn.execute(_filtered(select(func.count()).select_from(approvals),
                                              caller, query))).scalar_one()
        return min(int(total), MAX_COUNT), int(total) > MAX_COUNT
    rows = (await conn.execute(_filtered(select(*_SLIM), caller, query)
                               .limit(MAX_COUNT + 1))).all()
    return sum(1 for row in rows[:MAX_COUNT] if visible(row)), len(rows) > MAX_COUNT


async def _states(conn: AsyncConnection, rows: list[Any], *, public_url: str,
                  now: datetime) -> list[dict[str, Any]]:
    """The rows' state objects, their reviews and permits read in two queries."""
    ids = [row.id for row in rows]
    by_id: dict[str, list[Any]] = {i: [] for i in ids}
    if ids:
        for review in (await conn.execute(select(reviews).where(reviews.c.approval_id.in_(ids))
                                          .order_by(reviews.c.created_at, reviews.c.id))).all():
            by_id[review.approval_id].append(review)
    jtis = [row.permit_jti for row in rows if row.permit_jti]
    ledger = {p.jti: p for p in (await conn.execute(select(permits).where(
        permits.c.tenant == rows[0].tenant, permits.c.jti.in_(jtis)))).all()} if jtis else {}
    return [view(row, by_id[row.id], public_url=public_url, now=now,
                 permit_row=ledger.get(row.permit_jti)) for row in rows]


async def list_page(deps: AppContext, caller: Caller, query: Query) -> Page:
    """One page of the caller's queue (``query.pending``) or history, tenant-scoped.

    Queue: readers (runtime, admin, auditor) see every pending request; approvers the ones
    they could approve now. History: requests whose role the caller holds (readers: all).
    """
    now = deps.clock()
    await expire_due(deps.db, now, settings=deps.settings, tenant=caller.tenant)
    async with deps.db.read() as conn:
        marks = eligibility.Marks()
        if query.pending and not caller.has_any(*eligibility.READERS):
            marks = await eligibility.load_marks(conn, caller)

        def visible(row: Any) -> bool:
            if query.pending:
                return eligibility.in_queue(caller, row, marks, now)
            return eligibility.may_read(caller, row)

        cursor = decode_cursor(query)
        backward = bool(cursor and cursor[2])
        start = (cursor[0], cursor[1]) if cursor else None
        rows, last, capped = await _scan(conn, caller, query, start, backward, visible)
        more = len(rows) > query.size or capped
        rows = rows[:query.size]
        if backward:
            rows.reverse()
        has_next = (not backward and more) or (backward and cursor is not None)
        has_prev = (backward and more) or (not backward and cursor is not None)
        next_key = _key(query, rows[-1]) if rows else last
        if capped and not backward and last is not None:
            next_key = last  # continue after everything read, visible or not
        next_cursor = (encode_cursor(query, *next_key, back=False)
                       if has_next and next_key is not None else None)
        prev_key = _key(query, rows[0]) if rows else None
        if capped and backward and last is not None:
            prev_key = last
        prev_cursor = (encode_cursor(query, *prev_key, back=True)
                       if has_prev and prev_key is not None else None)
        total, total_capped = await _count(conn, caller, query, visible)
        items = await _states(conn, rows, public_url=deps.settings.public_url,
                              now=now) if rows else []
    return Page(items=items, next_cursor=next_cursor, prev_cursor=prev_cursor, total=total,
                total_capped=total_capped)
