"""The approver's lists: the inbox (pending, sortable, paged) and the history (filtered, paged).

Query parameters are read leniently: an unknown sort or status, a bad date or a page size
out of bounds falls back to the default or the bound; only a parameter over its length
limit (routes: 64 characters, 256 for ``tool``, 2048 for ``cursor``) is refused (422).
The rows come from :func:`cosigner.approvals.listing.list_page`, which keeps them in the
caller's tenant and applies the review rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from cosigner.approvals import listing
from cosigner.context import AppContext
from cosigner.identity.principals import Caller
from cosigner.web import pages

DEFAULT_SIZE = 50
INBOX_SORTS = {"expires": "Time left", "created": "Created", "tool": "Tool"}
HISTORY_SORTS = {"decided": "Decided", "created": "Created", "tool": "Tool"}
#: Default direction per sort: soonest expiry first, newest first, tools A→Z.
_DEFAULT_DESC = {"expires": False, "created": True, "tool": False, "decided": True}


@dataclass(frozen=True)
class ListParams:
    """The query string of a list page, as sent (raw text; parsed by the functions here)."""

    sort: str | None = None
    dir: str | None = None
    size: str | None = None
    cursor: str | None = None
    status: str | None = None
    tool: str | None = None
    since: str | None = None
    until: str | None = None


def _size(raw: str | None) -> int:
    try:
        return listing.clamp_size(int(raw or DEFAULT_SIZE))
    except ValueError:
        return DEFAULT_SIZE


def _day(raw: str | None) -> date | None:
    try:
        return date.fromisoformat(raw) if raw else None
    except ValueError:
        return None


def _sort(raw: str | None, allowed: dict[str, str], default: str, direction: str | None
          ) -> tuple[str, bool]:
    sort = raw if raw in allowed else default
    desc = _DEFAULT_DESC[sort] if direction not in ("asc", "desc") else direction == "desc"
    return sort, desc


def _columns(base: str, allowed: dict[str, str], sort: str, desc: bool,
             keep: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Sortable column headers by sort key: link (toggles the direction when already
    sorted by it), ``aria-sort``."""
    out = {}
    for key, label in allowed.items():
        active = key == sort
        new_desc = (not desc) if active else _DEFAULT_DESC[key]
        query = urlencode({**keep, "sort": key, "dir": "desc" if new_desc else "asc"})
        out[key] = {"key": key, "label": label, "href": f"{base}?{query}",
                    "aria_sort": ("descending" if desc else "ascending") if active else None}
    return out


def _pager(base: str, page: listing.Page, keep: dict[str, str]) -> dict[str, Any]:
    def link(cursor: str | None) -> str | None:
        return f"{base}?{urlencode({**keep, 'cursor': cursor})}" if cursor else None

    return {"next": link(page.next_cursor), "prev": link(page.prev_cursor),
            "first": f"{base}?{urlencode(keep)}" if page.prev_cursor else None}


async def inbox_page(deps: AppContext, caller: Caller, params: ListParams, *,
                     locale: str) -> dict[str, Any]:
    """The inbox: pending requests the caller may review now, one page of them.

    Returns ``{items, total, total_capped, columns, pager, size}``.
    """
    sort, desc = _sort(params.sort, INBOX_SORTS, "expires", params.dir)
    size = _size(params.size)
    page = await listing.list_page(deps, caller, listing.Query(
        pending=True, sort=sort, desc=desc, size=size, cursor=params.cursor))
    keep = {"sort": sort, "dir": "desc" if desc else "asc", "size": str(size)}
    return {"items": _items(deps, caller, page, locale), "total": page.total,
            "total_capped": page.total_capped, "size": size,
            "columns": _columns("/ui", INBOX_SORTS, sort, desc, {"size": str(size)}),
            "pager": _pager("/ui", page, keep)}


async def history_page(deps: AppContext, caller: Caller, params: ListParams, *,
                       locale: str) -> dict[str, Any]:
    """The history: decided requests, filtered by status, tool and decision date (UTC days,
    both ends included), one page of them.

    Returns ``{items, total, total_capped, columns, pager, size, filters, statuses}``.
    """
    sort, desc = _sort(params.sort, HISTORY_SORTS, "decided", params.dir)
    size = _size(params.size)
    status = params.status if params.status in listing.DECIDED else ""
    tool = (params.tool or "").strip()[:256]
    since, until = _day(params.since), _day(params.until)
    page = await listing.list_page(deps, caller, listing.Query(
        pending=False, sort=sort, desc=desc, size=size, cursor=params.cursor,
        statuses=(status,) if status else listing.DECIDED, tool=tool or None,
        decided_from=datetime.combine(since, time(), UTC) if since else None,
        decided_before=datetime.combine(until + timedelta(days=1), time(), UTC)
        if until and until < date.max else None))  # 9999-12-31: no day after it
    filters = {"status": status, "tool": tool, "since": since.isoformat() if since else "",
               "until": until.isoformat() if until else ""}
    kept_filters = {k: v for k, v in filters.items() if v}
    keep = {**kept_filters, "sort": sort, "dir": "desc" if desc else "asc", "size": str(size)}
    return {"items": _items(deps, caller, page, locale), "total": page.total,
            "total_capped": page.total_capped, "size": size, "filters": filters,
            "statuses": listing.DECIDED, "tools": _tool_names(deps, caller),
            "columns": _columns("/ui/history", HISTORY_SORTS, sort, desc,
                                {**kept_filters, "size": str(size)}),
            "pager": _pager("/ui/history", page, keep)}


def _items(deps: AppContext, caller: Caller, page: listing.Page, locale: str
           ) -> list[dict[str, Any]]:
    now = deps.clock()
    return [pages.item(state, now, locale=locale,
                       hints=pages.hints_for(deps, caller.tenant, state.get("policy"),
                                             state["tool"]))
            for state in page.items]


def _tool_names(deps: AppContext, caller: Caller) -> list[str]:
    """Tool names of the tenant's catalogue, for the filter's suggestions."""
    bundle = deps.store.snapshot.bundle_for(caller.tenant)
    catalogue = getattr(bundle, "catalogue", None)
    return sorted(catalogue.tools)[:200] if catalogue is not None else []
