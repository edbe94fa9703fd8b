"""Reading approval requests: one request's state (with long-poll) and the review queue.

Who may read: callers of the request's tenant holding ``runtime``, ``admin`` or ``auditor``,
or one of the roles the request needs. Another tenant's id is simply not found (invariant 7).
The permit of an approved request is shown to ``runtime`` callers only.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, func, select

from cosigner.approvals import eligibility
from cosigner.approvals.requests import (
    aware,
    expire_due,
    expire_if_due,
    permit_of,
    reviews_of,
)
from cosigner.approvals.views import effective_status, view
from cosigner.core.errors import Forbidden, NotFound
from cosigner.db.database import Database
from cosigner.db.raw_sql import RawStatement, read_connection
from cosigner.db.tables_approvals import approvals
from cosigner.identity.principals import Caller

if TYPE_CHECKING:
    from cosigner.context import AppContext

MAX_WAIT_S = 60.0
POLL_INTERVAL_S = 0.2
_READERS = eligibility.READERS


_may_read = eligibility.may_read


async def _read(deps: AppContext, caller: Caller, approval_id: str
                ) -> tuple[Any, list[Any], Any]:
    async with deps.db.read() as conn:
        row = (await conn.execute(select(approvals).where(
            approvals.c.id == approval_id, approvals.c.tenant == caller.tenant))).first()
        if row is None:
            raise NotFound("no such approval request")
        return row, await reviews_of(conn, approval_id), await permit_of(conn, row)


async def get_state(deps: AppContext, caller: Caller, approval_id: str, *,
                    wait_s: float = 0.0) -> dict[str, Any]:
    """The request's state; with ``wait_s`` (≤ 60 s) wait until it leaves ``pending``.

    Polls the database every 200 ms (replicas share nothing else), so a review on any
    replica ends the wait. While pending the state carries ``retry_after`` (s). At most
    ``settings.long_polls_per_credential`` waits of one credential are open at once.

    Raises:
        NotFound: no such request in the caller's tenant. Forbidden: the caller may not
        read it. Overloaded: the credential already has its bound of long-polls open
        (503, ``Retry-After``; nothing read).
    """
    if wait_s <= 0:
        return await _get_state(deps, caller, approval_id, wait_s=0.0)
    key = (caller.tenant, caller.principal_id)
    open_now = deps.long_polls.get(key, 0)
    if open_now >= deps.settings.long_polls_per_credential:
        raise deps.shedding.shed("long_poll", "this credential has too many long-polls "
                                 "open; retry later")
    deps.long_polls[key] = open_now + 1
    try:
        return await _get_state(deps, caller, approval_id, wait_s=wait_s)
    finally:
        left = deps.long_polls.get(key, 1) - 1
        if left > 0:
            deps.long_polls[key] = left
        else:
            deps.long_polls.pop(key, None)


async def _get_state(deps: AppContext, caller: Caller, approval_id: str, *,
                     wait_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + min(max(wait_s, 0.0), MAX_WAIT_S)
    while True:
        row, rows, permit = await _read(deps, caller, approval_id)
        if not _may_read(caller, row):
            raise Forbidden("you may not read this approval request")
        now = deps.clock()
        if row.status == "pending" and effective_status(row, now) == "expired":
            await expire_if_due(deps, caller.tenant, approval_id)
            row, rows, permit = await _read(deps, caller, approval_id)
        if row.status != "pending" or time.monotonic() >= deadline:
            return view(row, rows, public_url=deps.settings.public_url, now=now,
                        include_permit=caller.has_any("runtime"), permit_row=permit)
        await _wait_for_change(deps, caller.tenant, approval_id, deadline)


async def _wait_for_change(deps: AppContext, tenant: str, approval_id: str,
                           deadline: float) -> None:
    """Sleep in steps of :data:`POLL_INTERVAL_S`, reading only the request's status and
    expiry (one indexed row), until it left ``pending``, is due, is gone, or the deadline
    (``time.monotonic()``) passed; the caller then reads the whole state again."""
    while True:
        await asyncio.sleep(min(POLL_INTERVAL_S, max(deadline - time.monotonic(), 0.0)))
        if time.monotonic() >= deadline:
            return
        found = await _status(deps.db, tenant, approval_id)
        if found is None or found[0] != "pending" or deps.clock() >= aware(found[1]):
            return


_STATUS = select(approvals.c.status, approvals.c.expires_at).where(
    approvals.c.id == bindparam("id"), approvals.c.tenant == bindparam("tenant"))
_STATUS_RAW = RawStatement(_STATUS)


async def _status(db: Database, tenant: str, approval_id: str) -> tuple[str, Any] | None:
    """``(status, expires_at)`` of one request, or ``None``: on a SQLite file through the
    raw read connection (:func:`cosigner.db.raw_sql.read_connection`), else Core."""
    values = {"id": approval_id, "tenant": tenant}
    with read_connection(db, snapshot=False) as conn:
        if conn is not None:
            rows = _STATUS_RAW.run(conn, db.engine.dialect, values)[0]
            return (rows[0][0], rows[0][1]) if rows else None
    async with db.read() as conn:
        row = (await conn.execute(_STATUS, values)).first()
    return None if row is None else (row.status, row.expires_at)


async def list_requests(deps: AppContext, caller: Caller, *, status: str = "pending",
                        limit: int = 100) -> list[dict[str, Any]]:
    """Requests of the caller's tenant with ``status``, newest first; ``after_review``:
    break-glass authorisations whose mandatory review is still open.

    For ``runtime``/``admin``/``auditor`` callers: all of them. For approvers: those needing
    one of their roles; with ``pending``, only those they may review now (not expired, not
    their own, not already reviewed, not a second approval in a run they approved in).
    """
    now = deps.clock()
    # Stages that ended move first (escalated requests show up in their new approvers'
    # queue at once); an idle tenant costs one indexed read.
    await expire_due(deps.db, now, settings=deps.settings, tenant=caller.tenant)
    async with deps.db.read() as conn:
        which = (approvals.c.after_review == "open" if status == "after_review"
                 else approvals.c.status == status)
        rows = (await conn.execute(
            select(approvals).where(approvals.c.tenant == caller.tenant, which)
            .order_by(approvals.c.created_at.desc()).limit(500))).all()
        marks = eligibility.Marks()
        if status == "pending" and not caller.has_any(*_READERS):
            marks = await eligibility.load_marks(conn, caller)
        out: list[dict[str, Any]] = []
        for row in rows:
            if not _may_read(caller, row):
                continue
            if status == "pending" and not eligibility.in_queue(caller, row, marks, now):
                continue
            out.append(view(row, await reviews_of(conn, row.id),
                            public_url=deps.settings.public_url, now=now,
                            include_permit=caller.has_any("runtime"),
                            permit_row=await permit_of(conn, row)))
            if len(out) >= limit:
                break
    return out


async def pending_by_tenant(db: Database) -> dict[str, int]:
    """Pending approval requests per tenant (the ``cosigner_approvals_pending`` gauge)."""
    async with db.read() as conn:
        rows = (await conn.execute(
            select(approvals.c.tenant, func.count()).where(approvals.c.status == "pending")
            .group_by(approvals.c.tenant))).all()
    return {str(tenant): int(count) for tenant, count in rows}
