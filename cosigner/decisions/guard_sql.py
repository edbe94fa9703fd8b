"""The group-commit guard's three reads on SQLite's own driver (no SQLAlchemy execute).

:func:`cosigner.decisions.pdp.decision_log_writer`'s ``confirm`` runs, once per batch and
under the write lock, the same three queries as :func:`cosigner.decisions.pdp._decided`,
:func:`cosigner.runs.contracts.contracted` and
:func:`cosigner.approvals.rejections.rejected_calls`. On a file SQLite database (the
inline driver, :mod:`cosigner.db.sqlite_inline`) it runs them here as plain SQL on the
``sqlite3`` connection of the batch's transaction: SQLAlchemy's execution context and
result set cost more than the query itself (issue 20). Same tables, same predicates,
same answers — tests/decisions/test_guard_sql.py compares each with its SQLAlchemy
original on the same rows. Driver errors surface as SQLAlchemy's
(:func:`cosigner.db.raw_insert.sqlite_query`), so the batch fails closed as before.
"""

from __future__ import annotations

import sqlite3
from typing import Any, NamedTuple
from weakref import WeakKeyDictionary

from sqlalchemy.engine import Dialect

from cosigner.db import response_row
from cosigner.db.compressed import RowBound
from cosigner.db.raw_insert import sqlite_query
from cosigner.db.tables import decisions

_Call = tuple[str, str, str, str]


class Decided(NamedTuple):
    """A first decision's stored ``request_hash`` and ``response`` (as ``_decided``'s row)."""

    request_id: str
    request_hash: str
    response: Any


def _marks(n: int) -> str:
    return ", ".join("?" * n)


#: Per dialect object (weakly, as :mod:`cosigner.db.row_encoders`): the result processors
#: of ``decisions.response``, ``request_hash`` and ``id``, built once instead of per batch
#: (SQLAlchemy's ``dialect_impl`` and ``result_processor``: ~4 µs for the three).
_PROCESSORS: WeakKeyDictionary[Dialect, tuple[Any, Any, Any]] = WeakKeyDictionary()


def _processors(dialect: Dialect) -> tuple[Any, Any, Any]:
    found = _PROCESSORS.get(dialect)
    if found is None:
        load, text, ident = (
            column.type.dialect_impl(dialect).result_processor(dialect, None)
            for column in (decisions.c.response, decisions.c.request_hash, decisions.c.id))
        found = _PROCESSORS[dialect] = (load, text, ident)
    return found


def decided(raw: sqlite3.Connection, dialect: Dialect, requests: set[tuple[str, str]]
            ) -> dict[tuple[str, str], Decided]:
    """``pdp._decided``: one query per tenant on the unique ``(tenant, request_id)`` key."""
    by_tenant: dict[str, list[str]] = {}
    for tenant, request_id in requests:
        by_tenant.setdefault(tenant, []).append(request_id)
    load, text, ident = _processors(dialect)
    found: dict[tuple[str, str], Decided] = {}
    for tenant, ids in sorted(by_tenant.items()):
        # id, args_hash, policy_revision, run_id: what a stored form 3/7 response refers to.
        rows = sqlite_query(raw, "SELECT request_id, request_hash, response, id, args_hash, "
                            "policy_revision, run_id FROM decisions "
                            f"WHERE tenant = ? AND request_id IN ({_marks(len(ids))})",
                            [tenant, *ids])
        for request_id, request_hash, response, key, args_hash, revision, run in rows:
            answer = load(response) if load else response
            if isinstance(answer, RowBound):
                answer = response_row.unpack(answer.stored, (
                    ident(key) if ident else key, request_id,
                    text(args_hash) if text else args_hash,
                    None if revision is None else text(revision) if text else revision, run))
            found[(tenant, request_id)] = Decided(
                request_id, str(text(request_hash) if text else request_hash), answer)
    return found


def contracted(raw: sqlite3.Connection, pairs: set[tuple[str, str]]
               ) -> set[tuple[str, str]]:
    """``contracts.contracted``: which ``(tenant, run_id)`` pairs have a contract."""
    tenants = sorted({tenant for tenant, _ in pairs})
    ids = sorted({run_id for _, run_id in pairs})
    # tenant and run_id both constrained: a search of the primary key, not a scan.
    rows = sqlite_query(raw, f"SELECT tenant, run_id FROM runs WHERE tenant IN "
                        f"({_marks(len(tenants))}) AND run_id IN ({_marks(len(ids))})",
                        [*tenants, *ids])
    return {(tenant, run_id) for tenant, run_id in rows} & pairs


def rejected_calls(raw: sqlite3.Connection, calls: set[_Call]) -> set[_Call]:
    """``rejections.rejected_calls``: which calls have a standing (not withdrawn)
    rejection."""
    tenants = sorted({call[0] for call in calls})
    runs = sorted({call[1] for call in calls})
    rows = sqlite_query(
        raw, "SELECT tenant, run_id, tool, args_hash FROM approvals "
        f"WHERE tenant IN ({_marks(len(tenants))}) AND run_id IN ({_marks(len(runs))}) "
        "AND status = 'rejected' AND withdrawn_at IS NULL", [*tenants, *runs])
    return {(t, r, tool, h) for t, r, tool, h in rows} & calls
