"""Run contracts: what one agent run may do, enforced by code before policy.

A trusted runtime registers a contract at the start of a run (DESIGN § Run contracts):
``allowed_tools``, per-tool call limits (``tool_limits``), a budget (``max_tool_calls``,
``max_cost`` in minor units) and a ``deadline`` (RFC 3339, UTC). A contract cannot be
widened once set: registering the identical contract again is idempotent, any other one
is refused (``contract_conflict``). A contract comes before the run's first call: once any
decision of the run is recorded, registering one is refused (``run_started``, 409) rather
than leaving earlier calls uncounted; start a new run id instead.

Each decision of the run is checked against the contract before policy and counted in
the same write transaction as the decision (:func:`check_and_count`): SQLite's
``BEGIN IMMEDIATE`` serialises writers, PostgreSQL locks the run row ``FOR UPDATE``, so
concurrent calls in one run can never overspend. A call is counted when its decision is
``allow`` or ``require_approval``; costs are counted from outcome reports
(:func:`add_cost`), so by default ``max_cost`` is enforced after the fact: a call is refused
once the reported costs reach the budget, and the call that crosses it is not known in
advance. A contract may name, per tool, the argument that declares the call's expected cost
(``cost_args``: tool → RFC 6901 pointer into the arguments, an integer in minor units); such
a call is refused when ``reported + expected > max_cost``, and denied ``cost_undeclared``
when the argument is missing or not a non-negative integer. The check is against costs
reported so far: calls allowed but not yet reported are not reserved. Refusals, in check
order:

* ``deadline_passed`` — ``now >= deadline`` (expiry wins at the instant, as for approvals);
* ``outside_contract`` — the tool is not in ``allowed_tools``;
* ``budget_exhausted`` — ``max_tool_calls`` reached, ``max_cost`` reached (or would be
  exceeded by the call's declared cost), or the tool's own limit reached;
* ``cost_undeclared`` — the contract names a cost argument for the tool and the call's
  arguments do not carry a non-negative integer there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.audit.chain import Event, append
from cosigner.core.canonical import canonicalize, hash_bytes
from cosigner.core.clock import isoformat
from cosigner.core.errors import (
    ContractConflict,
    InvalidRequest,
    NotFound,
    RunStarted,
    Unavailable,
)
from cosigner.core.pointer import resolve
from cosigner.db.database import Database, UniqueViolation
from cosigner.db.raw_insert import raw_sqlite
from cosigner.db.raw_sql import RawStatement
from cosigner.db.tables import decisions
from cosigner.db.tables_runs import runs
from cosigner.identity.principals import Caller
from cosigner.policy.result import Reason

__all__ = ["ContractedRuns", "RunContractFound", "RunState", "add_cost", "check_and_count",
           "contracted", "get_run", "load", "refusal", "register_contract"]


class RunContractFound(Unavailable):
    """A decision taken on the assumption that its run has no contract met one inside the
    write transaction: nothing was written; decide again with the contract. Internal to
    :func:`cosigner.decisions.pdp.decide` (were it ever to escape, it answers 503: deny)."""


class ContractedRuns:
    """``(tenant, run_id)`` pairs this process knows to have a contract.

    Contracts are never removed or changed, so a pair once seen stays true; a pair not in
    the set is only a guess, which the decision's write transaction confirms (see
    :func:`contracted`). Bounded: at ``limit`` pairs the set starts again empty, which
    costs a few decisions a second attempt, never a wrong answer.
    """

    def __init__(self, limit: int = 100_000) -> None:
        self._pairs: set[tuple[str, str]] = set()
        self._limit = limit

    def __contains__(self, pair: object) -> bool:
        return pair in self._pairs

    def add(self, tenant: str, run_id: str) -> None:
        if len(self._pairs) >= self._limit:
            self._pairs.clear()
        self._pairs.add((tenant, run_id))


@dataclass(frozen=True, slots=True)
class RunState:
    """A run's contract and its live counters (counted calls, reported cost)."""

    run_id: str
    contract: dict[str, Any]
    deadline: datetime | None
    tool_calls: int = 0
    cost_minor: int = 0
    tool_counts: dict[str, int] = field(default_factory=dict)
    created_at: datetime | None = None

    def as_input(self) -> dict[str, Any]:
        """The contract part of ``input.run`` (counters are the values before this call)."""
        return {"contract": self.contract, "tool_calls": self.tool_calls,
                "cost_minor": self.cost_minor, "tool_counts": dict(self.tool_counts)}

    def as_dict(self) -> dict[str, Any]:
        """The Run v1 wire object."""
        return {"run_id": self.run_id, **self.as_input(),
                "created_at": isoformat(self.created_at) if self.created_at else None}


# ----------------------------------------------------------------------------- pure rules


def normalise_contract(raw: dict[str, Any]) -> tuple[dict[str, Any], datetime | None]:
    """The stored form of a validated contract body, and its deadline.

    ``allowed_tools`` is sorted and de-duplicated (``None`` = any tool); the deadline is
    re-written as RFC 3339 UTC with a ``Z``. Raises :class:`InvalidRequest`
    (``invalid_contract``) for a limit on a tool that is not allowed, or a deadline that is
    not an RFC 3339 timestamp with an offset.
    """
    allowed = raw.get("allowed_tools")
    tools = sorted(set(allowed)) if allowed is not None else None
    limits = dict(sorted((raw.get("tool_limits") or {}).items()))
    if tools is not None:
        stray = sorted(set(limits) - set(tools))
        if stray:
            raise InvalidRequest(f"tool_limits names tools not in allowed_tools: {stray}",
                                 code="invalid_contract")
    budget = raw.get("budget") or {}
    cost_args = dict(sorted((raw.get("cost_args") or {}).items()))
    if tools is not None:
        stray = sorted(set(cost_args) - set(tools))
        if stray:
            raise InvalidRequest(f"cost_args names tools not in allowed_tools: {stray}",
                                 code="invalid_contract")
    bad = sorted(tool for tool, ptr in cost_args.items() if not ptr.startswith("/"))
    if bad:
        raise InvalidRequest(f"cost_args must be JSON pointers (RFC 6901) into the "
                             f"arguments, e.g. /amount_minor: {bad}", code="invalid_contract")
    deadline = _parse_deadline(raw.get("deadline"))
    contract = {
        "allowed_tools": tools,
        "tool_limits": limits,
        "budget": {"max_tool_calls": budget.get("max_tool_calls"),
                   "max_cost": budget.get("max_cost")},
        "deadline": isoformat(deadline) if deadline else None,
    }
    if cost_args:  # only when used: contracts registered before it keep their hash
        contract["cost_args"] = cost_args
    return contract, deadline


def _parse_deadline(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None or "T" not in value.upper():
        raise InvalidRequest("deadline must be an RFC 3339 timestamp with an offset, "
                             "e.g. 2030-01-01T00:00:00Z", code="invalid_contract")
    return moment.astimezone(UTC)


def refusal(state: RunState | None, tool: str, now: datetime,
            args: Any = None) -> Reason | None:
    """Why ``tool`` may not be called now with ``args`` in this run, or ``None`` (pure; see
    module doc)."""
    if state is None:
        return None
    contract = state.contract
    if state.deadline is not None and now >= state.deadline:
        return Reason("deadline_passed", f"the run's deadline {contract['deadline']} passed")
    allowed = contract.get("allowed_tools")
    if allowed is not None and tool not in allowed:
        return Reason("outside_contract", f"{tool} is not in the run's contract")
    budget = contract.get("budget") or {}
    max_calls = budget.get("max_tool_calls")
    if max_calls is not None and state.tool_calls >= max_calls:
        return Reason("budget_exhausted", f"the run used its {max_calls} tool calls")
    max_cost = budget.get("max_cost")
    if max_cost is not None and state.cost_minor >= max_cost:
        return Reason("budget_exhausted", f"the run spent its budget of {max_cost} minor units")
    cost_arg = (contract.get("cost_args") or {}).get(tool)
    if cost_arg is not None:
        expected = resolve(args, cost_arg)
        if isinstance(expected, bool) or not isinstance(expected, int) or expected < 0:
            return Reason("cost_undeclared", f"{tool} must declare its cost as a "
                          f"non-negative integer at {cost_arg}")
        if max_cost is not None and state.cost_minor + expected > max_cost:
            return Reason("budget_exhausted", f"this call's {expected} minor units would "
                          f"exceed the run's budget of {max_cost} ({state.cost_minor} spent)")
    limit = (contract.get("tool_limits") or {}).get(tool)
    if limit is not None and state.tool_counts.get(tool, 0) >= limit:
        return Reason("budget_exhausted", f"the run used its {limit} calls of {tool}")
    return None


# ----------------------------------------------------------------------------- storage


def _utc(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)  # SQLite returns naive UTC
    return value


def _state(row: Any) -> RunState:
    return RunState(run_id=row.run_id, contract=dict(row.contract),
                    deadline=_utc(row.deadline), tool_calls=int(row.tool_calls),
                    cost_minor=int(row.cost_minor), tool_counts=dict(row.tool_counts),
                    created_at=_utc(row.created_at))


_RUN = select(runs).where(runs.c.tenant == bindparam("tenant"),
                          runs.c.run_id == bindparam("run_id"))
_RUN_FOR_UPDATE = _RUN.with_for_update()


async def load(conn: AsyncConnection, tenant: str, run_id: str, *,
               for_update: bool = False) -> RunState | None:
    """The run's state, or ``None`` when no contract is registered.

    ``for_update`` locks the row on PostgreSQL (SQLite's write transaction already holds
    the database lock).
    """
    values = {"tenant": tenant, "run_id": run_id}
    raw = await raw_sqlite(conn)
    if raw is not None:  # SQLite: the connection's own sqlite3 driver, no Core round trip
        rows = _RUN_RAW.run(raw, conn.dialect, values)[0]
        return _state(_RunRow(*rows[0])) if rows else None
    query = (_RUN_FOR_UPDATE if for_update and conn.dialect.name == "postgresql"
             else _RUN)
    row = (await conn.execute(query, values)).first()
    return _state(row) if row is not None else None


_RUN_RAW = RawStatement(_RUN)
class _RunRow(NamedTuple):
    """A ``runs`` row as the raw SQLite path returns it (its columns, in order)."""

    tenant: str
    run_id: str
    contract: dict[str, Any]
    contract_hash: str
    deadline: datetime | None
    tool_calls: int
    cost_minor: int
    tool_counts: dict[str, int]
    created_by: str
    created_at: datetime
    updated_at: datetime


if _RunRow._fields != tuple(column.key for column in runs.columns):  # a schema change
    raise RuntimeError("_RunRow's fields are not the runs table's columns")


async def contracted(conn: AsyncConnection, pairs: set[tuple[str, str]]
                     ) -> set[tuple[str, str]]:
    """Which of the ``(tenant, run_id)`` pairs have a contract, in one query (a group-commit
    batch holds at most ``log_batch_max`` ≤ 1,000 of them)."""
    # Both key columns constrained: a search of the (tenant, run_id) primary key, not a
    # scan of it (a scan grows with the runs that have a contract).
    rows = await conn.execute(select(runs.c.tenant, runs.c.run_id).where(
        runs.c.tenant.in_({tenant for tenant, _ in pairs}),
        runs.c.run_id.in_({run_id for _, run_id in pairs})))
    return {(row.tenant, row.run_id) for row in rows} & pairs


async def check_and_count(conn: AsyncConnection, *, tenant: str, run_id: str, tool: str,
                          now: datetime, count: bool, assumed_none: bool = False,
                          args: Any = None) -> Reason | None:
    """Re-check the contract inside the decision's write transaction and count the call.

    Returns the refusal reason (nothing counted) or ``None``; when ``count`` is true the
    run's ``tool_calls`` and the tool's count go up by one. No contract → ``None``.

    Raises:
        RunContractFound: ``assumed_none`` (the decision was evaluated without a
            contract) and the run has one.
    """
    state = await load(conn, tenant, run_id, for_update=True)
    if state is not None and assumed_none:
        raise RunContractFound("the run has a contract; decide again with it")
    reason = refusal(state, tool, now, args)
    if state is None or reason is not None or not count:
        return reason
    counts = dict(state.tool_counts)
    counts[tool] = counts.get(tool, 0) + 1
    await conn.execute(runs.update()
                       .where(runs.c.tenant == tenant, runs.c.run_id == run_id)
                       .values(tool_calls=runs.c.tool_calls + 1, tool_counts=counts,
                               updated_at=now))
    return None


async def add_cost(conn: AsyncConnection, *, tenant: str, run_id: str, cost_minor: int,
                   now: datetime) -> None:
    """Count a reported cost (minor units) against the run's budget (no contract: no-op)."""
    if cost_minor:
        await conn.execute(runs.update()
                           .where(runs.c.tenant == tenant, runs.c.run_id == run_id)
                           .values(cost_minor=runs.c.cost_minor + cost_minor, updated_at=now))


# ----------------------------------------------------------------------------- use cases


async def register_contract(db: Database, caller: Caller, raw: dict[str, Any], *,
                            now: datetime, known: ContractedRuns | None = None
                            ) -> tuple[dict[str, Any], bool]:
    """Register the contract of run ``raw["run_id"]`` in the caller's tenant; ``known``
    (the process's :class:`ContractedRuns`) learns the run, so its decisions read the
    contract before policy (were the registration to fail, that only costs a read).

    Returns ``(Run v1 object, created)``: ``created`` is false when the identical contract
    was already registered (idempotent). Raises :class:`ContractConflict` (409) when a
    different contract exists, :class:`RunStarted` (409 ``run_started``) when the run
    already has a decision, :class:`InvalidRequest` (422) for an invalid contract,
    ``Unavailable`` (503) when it cannot be recorded.
    """
    run_id = raw["run_id"]
    contract, deadline = normalise_contract(raw)
    digest = hash_bytes(canonicalize(contract))
    actor = {"subject": caller.subject, "principal_id": caller.principal_id,
             "kind": caller.kind}
    if known is not None:
        known.add(caller.tenant, run_id)
    try:
        async with db.transaction() as conn:
            existing = await load(conn, caller.tenant, run_id)
            if existing is None:
                started = (await conn.execute(
                    select(decisions.c.id).where(decisions.c.tenant == caller.tenant,
                                                 decisions.c.run_id == run_id).limit(1)
                )).first()
                if started is not None:
                    raise RunStarted("the run already has decisions; register its contract "
                                     "before its first call, or start a new run",
                                     run_id=run_id)
                await conn.execute(runs.insert().values(
                    tenant=caller.tenant, run_id=run_id, contract=contract,
                    contract_hash=digest, deadline=deadline, tool_calls=0, cost_minor=0,
                    tool_counts={}, created_by=caller.subject, created_at=now,
                    updated_at=now))
                await append(conn, caller.tenant, [Event(
                    type="run.contract_registered", actor=actor, run_id=run_id,
                    payload={"contract": contract, "contract_hash": digest})], now=now)
                return RunState(run_id=run_id, contract=contract, deadline=deadline,
                                created_at=now).as_dict(), True
    except UniqueViolation:
        pass  # a concurrent registration won; compare with it below
    async with db.read() as conn:
        existing = await load(conn, caller.tenant, run_id)
    assert existing is not None
    if hash_bytes(canonicalize(existing.contract)) != digest:
        raise ContractConflict("run already has a different contract; contracts cannot be "
                               "changed or widened", run_id=run_id)
    return existing.as_dict(), False


async def get_run(db: Database, caller: Caller, run_id: str) -> dict[str, Any]:
    """The Run v1 object of ``run_id`` in the caller's tenant; :class:`NotFound` if none."""
    async with db.read() as conn:
        state = await load(conn, caller.tenant, run_id)
    if state is None:
        raise NotFound("no contract is registered for this run")
    return state.as_dict()
