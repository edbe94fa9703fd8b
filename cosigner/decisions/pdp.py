"""decide(): the policy decision point's one use case.

Flow (DESIGN § Data flow): args hash (RFC 8785) → idempotency check → run contract →
tool catalogue (schema, unknown tool) → policy evaluation (active + shadow) → a standing
rejection of the same call in the run wins over policy
(:mod:`cosigner.approvals.rejections`) → one write
holding the decision row, its decision-log events, the run counters, the approval
request or the permit row. Writes go through the process's group committer: many
decisions share one transaction and one COMMIT, and a response is released only after
the COMMIT that holds its events (invariant 2).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.approvals import rejections
from cosigner.audit.chain import Event, append, append_pg, append_raw
from cosigner.context import AppContext
from cosigner.core import logs, tracing
from cosigner.core.canonical import args_hash as compute_args_hash
from cosigner.core.canonical import canonicalize, canonicalize_member, hash_bytes
from cosigner.core.clock import isoformat
from cosigner.core.errors import CosignerError, IdempotencyConflict, InvalidRequest
from cosigner.core.ids import new_id
from cosigner.core.load import Shedding
from cosigner.core.metrics import metrics
from cosigner.core.roles import BARRIER_TOOL
from cosigner.core.settings import Settings
from cosigner.db import raw_pg, response_row
from cosigner.db.batch import Item, PgHooks, RawHooks, Write, savepoint_runner
from cosigner.db.database import Database, UniqueViolation
from cosigner.db.group_commit import GroupCommitter
from cosigner.db.raw_insert import raw_sqlite
from cosigner.db.tables import DECISION_ANSWER, decisions
from cosigner.decisions import guard_sql
from cosigner.decisions.plan import Assumed, Call, DecisionPlan
from cosigner.identity.principals import Caller
from cosigner.policy.result import deny
from cosigner.policy.store import Evaluation
from cosigner.runs import contracts

log = logging.getLogger("cosigner.decisions")


class DecisionRequest(NamedTuple):
    """A validated DecisionRequest v1. ``args``/``context`` are exactly the parsed JSON."""

    request_id: str
    run: dict[str, Any]
    principal: dict[str, Any]
    initiator: dict[str, Any]
    tool: dict[str, Any]
    args: dict[str, Any]
    context: dict[str, Any]
    raw: dict[str, Any]
    #: ``shadow``: recorded as such, never a permit or an approval request (issue 18).
    mode: str = "on"


def decision_log_writer(db: Database, settings: Settings,
                        shedding: Shedding | None = None) -> GroupCommitter[Item]:
    """The group committer for decisions and redeems: one transaction and one COMMIT per
    batch; the events of the items that succeeded are chained per tenant, and what the
    prepared decisions assumed (no run contract, no standing rejection of an allowed
    call) is confirmed first, one query each per batch (``confirm``)."""

    async def chain_events(conn: AsyncConnection, written: list[Write]) -> None:
        by_tenant = _events_by_tenant(written)
        # Heads locked in one global order, so two replicas' batches form no lock cycle.
        for tenant in sorted(by_tenant):
            events = by_tenant[tenant]
            await append(conn, tenant, events, now=events[0].time or datetime.now(UTC))

    def chain_events_raw(raw: sqlite3.Connection, dialect: Dialect,
                         written: list[Write]) -> None:
        by_tenant = _events_by_tenant(written)
        for tenant in sorted(by_tenant):
            events = by_tenant[tenant]
            append_raw(raw, dialect, tenant, events, now=events[0].time or datetime.now(UTC))

    async def chain_events_pg(conn: Any, dialect: Dialect, written: list[Write]) -> None:
        by_tenant = _events_by_tenant(written)
        for tenant in sorted(by_tenant):  # the same global order
            events = by_tenant[tenant]
            await append_pg(conn, dialect, tenant, events,
                            now=events[0].time or datetime.now(UTC))

    async def confirm(conn: AsyncConnection, written: list[Write]
                      ) -> dict[int, CosignerError]:
        # Decisions taken without a contract pre-read: confirm under the write lock that
        # their run still has none, else they are decided again with it. Allowed calls:
        # confirm nobody rejected the same call in the run, else they are decided again
        # on the locked path, which denies them (cosigner.approvals.rejections).
        # A retried request_id: answered from the first decision, read here in one
        # indexed query for the whole batch (no failed insert, no rollback).
        assumed, runs, calls, requests = _assumptions(written)
        raw = await raw_sqlite(conn)
        if raw is not None:  # the same three queries on the driver (guard_sql.py)
            return confirm_raw(raw, conn.dialect, written)
        decided = await _decided(conn, requests) if requests else {}
        contracted = await contracts.contracted(conn, runs) if runs else set()
        rejected = await rejections.rejected_calls(conn, calls) if calls else set()
        return _refusals(assumed, decided, contracted, rejected)

    def confirm_raw(raw: sqlite3.Connection, dialect: Dialect, written: list[Write]
                    ) -> dict[int, CosignerError]:
        assumed, runs, calls, requests = _assumptions(written)
        return _refusals(
            assumed, guard_sql.decided(raw, dialect, requests) if requests else {},
            guard_sql.contracted(raw, runs) if runs else set(),
            guard_sql.rejected_calls(raw, calls) if calls else set())

    async def confirm_pg(conn: Any, dialect: Dialect, written: list[Write]
                         ) -> dict[int, CosignerError]:
        assumed, runs, calls, requests = _assumptions(written)
        if not (requests or runs or calls):
            return {}
        found = await raw_pg.guard_reads(conn, dialect, requests, runs, calls)
        return _refusals(
            assumed, {key: guard_sql.Decided(*row) for key, row in found.decided.items()},
            found.contracted, found.rejected)

    return GroupCommitter(savepoint_runner(db, finish=chain_events, guard=confirm,
                                           raw=RawHooks(confirm_raw, chain_events_raw),
                                           pg=PgHooks(confirm_pg, chain_events_pg)),
                          max_batch=settings.log_batch_max,
                          max_wait_s=settings.log_batch_wait_ms / 1000,
                          max_queue=settings.log_queue_max,
                          max_queue_per_key=settings.log_queue_per_tenant_max,
                          shedding=shedding, name="decisions")


def _events_by_tenant(written: list[Write]) -> dict[str, list[Event]]:
    by_tenant: dict[str, list[Event]] = {}
    for item in written:
        by_tenant.setdefault(item.tenant, []).extend(item.events)
    return by_tenant


def _assumptions(written: list[Write]) -> tuple[list[Assumed | None], set[Any], set[Any],
                                                set[tuple[str, str]]]:
    assumed: list[Assumed | None] = [item.assumes for item in written]
    runs = {a.run for a in assumed if a is not None}
    calls = {a.call for a in assumed if a is not None and a.call is not None}
    requests = {a.request for a in assumed if a is not None}
    return assumed, runs, calls, requests


def _refusals(assumed: list[Assumed | None], decided: dict[tuple[str, str], Any],
              contracted: set[Any], rejected: set[Any]) -> dict[int, CosignerError]:
    refused: dict[int, CosignerError] = {}
    for i, a in enumerate(assumed):
        if a is None:
            continue
        if a.request in decided:
            refused[i] = AlreadyDecided(decided[a.request])
        elif a.run in contracted:
            refused[i] = contracts.RunContractFound("the run has a contract")
        elif a.call in rejected:
            refused[i] = rejections.RejectionFound("a reviewer rejected this call")
    return refused


def input_document(caller: Caller, req: DecisionRequest, *, now: str,
                   run_state: dict[str, Any] | None = None) -> dict[str, Any]:
    """The policy input (``input.*``), documented in README § Policy input."""
    return {
        "tenant": caller.tenant,
        "principal": req.principal,
        "initiator": req.initiator,
        "caller": {"subject": caller.subject, "roles": sorted(caller.roles)},
        "tool": req.tool,
        "args": req.args,
        "context": req.context,
        "run": {**req.run, **(run_state or {})},
        "now": now,
    }


class AlreadyDecided(CosignerError):
    """The batch found the request_id already decided: ``row`` (request_hash, response)
    is the first decision; nothing of this one was written. Never leaves decide()."""

    code = "already_decided"

    def __init__(self, row: Any) -> None:
        super().__init__("request_id already decided")
        self.row = row


async def _decided(conn: AsyncConnection, requests: set[tuple[str, str]]
                   ) -> dict[tuple[str, str], Any]:
    """The stored ``(request_hash, response)`` of those ``(tenant, request_id)`` already
    decided, under the batch's write lock: one query per tenant on the unique key
    (``tenant = ? AND request_id IN (…)`` is a search of that index; a row-value ``IN``
    would scan it, a cost growing with the log)."""
    by_tenant: dict[str, list[str]] = {}
    for tenant, request_id in requests:
        by_tenant.setdefault(tenant, []).append(request_id)
    found: dict[tuple[str, str], Any] = {}
    for tenant, ids in sorted(by_tenant.items()):
        rows = (await conn.execute(_DECIDED, {"tenant": tenant, "ids": ids})).all()
        found.update(((tenant, row.request_id), row) for row in rows)
    return found


#: The request hash and the stored answer with the columns it refers to.
_DECIDED = select(decisions.c.request_hash, *DECISION_ANSWER).where(
    decisions.c.tenant == bindparam("tenant"),
    decisions.c.request_id.in_(bindparam("ids", expanding=True)))


async def _existing(conn: AsyncConnection, tenant: str, request_id: str) -> Any:
    return (await conn.execute(
        select(decisions.c.request_hash, *DECISION_ANSWER).where(
            decisions.c.tenant == tenant, decisions.c.request_id == request_id)
    )).first()


def _replay(row: Any, request_hash: str) -> dict[str, Any]:
    if row.request_hash != request_hash:
        raise IdempotencyConflict("request_id was already used with a different request")
    return dict(response_row.answer(row))


async def decide(deps: AppContext, caller: Caller, req: DecisionRequest) -> dict[str, Any]:
    """Decide one proposed tool call and record it durably.

    Args:
        deps: collaborators. caller: authenticated runtime. req: the parsed request.

    Returns:
        The Decision v1 object (``decision_id, effect, reasons, policy, args_hash``,
        ``permit`` for allow, ``approval`` for require_approval).

    Raises:
        InvalidJSON/InvalidArgs: arguments cannot be hashed or fail the tool schema (422;
            nothing evaluated, no approval opened).
        IdempotencyConflict: ``request_id`` reused with different content (409).
        InvalidRequest: ``reserved_tool`` for the program-barrier tool (422).
        Unavailable: the decision could not be recorded (503; treat as deny).
    """
    if req.tool["name"] == BARRIER_TOOL:
        # Only a reviewed program barrier may yield a permit for this tool.
        raise InvalidRequest(f"{BARRIER_TOOL} is reserved for program barriers "
                             "(POST /v1/approvals)", code="reserved_tool")
    pair = (caller.tenant, req.run["id"])
    read_contract, locked = pair in deps.contracted_runs, False
    started = time.perf_counter()
    while True:  # each retry sets a flag, so this runs at most three times
        try:
            return await _decide(deps, caller, req, read_contract=read_contract,
                                 locked=locked, started=started)
        except contracts.RunContractFound:
            # Decided as if the run had no contract, but it has one: nothing was written.
            if read_contract:
                raise
            deps.contracted_runs.add(*pair)
            read_contract = True
        except rejections.RejectionFound:
            # A prepared allow of a call a reviewer rejected: nothing was written; the
            # locked path denies it rejected_by_reviewer.
            if locked:
                raise
            locked = True


async def _decide(deps: AppContext, caller: Caller, req: DecisionRequest, *,
                  read_contract: bool, locked: bool, started: float) -> dict[str, Any]:
    tenant = caller.tenant
    decision_id = new_id()
    logs.decision_id.set(decision_id)  # every log line of this decision names it
    # One proof covers the args and the whole request (the args are a member of it).
    both = canonicalize_member(req.raw, "args") if req.raw.get("args") is req.args else None
    a_hash = hash_bytes(both[0]) if both else compute_args_hash(req.args)
    # No idempotency pre-read: the batch's guard reads the first decision of a retried
    # request_id under its write lock, for all its decisions in one query; a retry that
    # races its first decision into the same batch (or another replica's) meets the
    # unique (tenant, request_id) key and is answered from a read after it.
    run_state: contracts.RunState | None = None
    if read_contract:
        async with deps.db.read() as conn:
            run_state = await contracts.load(conn, tenant, req.run["id"])
    # Without a contract (read or assumed), the write confirms the run still has none.

    snapshot = deps.store.snapshot
    now = deps.clock()
    bundle = snapshot.bundle_for(tenant)
    tool_name = req.tool["name"]
    evaluation: Evaluation
    mask: tuple[str, ...] = ()
    spec = bundle.catalogue.lookup(tool_name) if bundle and bundle.catalogue else None
    # One input document: what the policy evaluates is what redeem re-checks later.
    input_doc = input_document(caller, req, now=isoformat(now), run_state=(
        run_state.as_input() if run_state else None))
    off_contract = contracts.refusal(run_state, tool_name, now, req.args)  # before policy
    if off_contract is not None:
        evaluation = Evaluation(deny(off_contract.code, off_contract.message),
                                bundle.ref() if bundle else None, bundle)
    elif bundle is not None and bundle.catalogue is not None and spec is None:
        evaluation = Evaluation(deny("unknown_tool", f"{tool_name} is not in the tool "
                                     "catalogue"), bundle.ref(), bundle)
    else:
        if spec is not None:
            spec.validate(req.args)  # raises InvalidArgs before any policy runs
            mask = tuple(spec.mask)
        evaluation = await deps.store.evaluate(tenant, input_doc, snapshot=snapshot)
    trace_id = tracing.current_trace_id()
    plan = DecisionPlan(
        deps=deps, call=Call(
            caller=caller, request_id=req.request_id,
            request_hash=hash_bytes(both[1] if both else canonicalize(req.raw)), run=req.run,
            principal=req.principal, initiator=req.initiator, tool=req.tool, args=req.args,
            context=req.context, args_hash=a_hash, mode=req.mode),
        decision_id=decision_id, now=now, evaluation=evaluation, input_doc=input_doc,
        mask=mask + evaluation.result.mask, contract=run_state is not None, locked=locked,
        trace_id=trace_id)
    try:
        if evaluation.result.effect == "require_approval":
            await deps.quotas.count_approval(caller)
            if deps.webhook_backlog.full(tenant):
                raise deps.shedding.shed("webhooks", "the tenant's webhook backlog is full; "
                                         "no approval request opens until it drains")
        written: Write = await deps.log_writer.submit(plan.item(), key=tenant)
    except AlreadyDecided as first:
        # A retry: the batch read the first decision under its lock (no insert tried).
        return _replay(first.row, plan.call.request_hash)
    except UniqueViolation:
        # A concurrent retry with the same request_id won the insert: answer with it.
        async with deps.db.read() as conn:
            row = await _existing(conn, tenant, req.request_id)
        if row is None:
            raise
        return _replay(row, plan.call.request_hash)
    final: dict[str, Any] = written.result
    _observe(final, evaluation, started, mode=req.mode)
    return final


def _observe(final: dict[str, Any], evaluation: Evaluation, started: float, *,
             mode: str) -> None:
    """Count and time one recorded decision; name it on the current span."""
    effect = final["effect"]
    reasons = final["reasons"]
    bundle = evaluation.bundle
    metrics().decided(
        effect=effect, engine=bundle.manifest.engine if bundle else "none",
        reason=reasons[0]["code"] if reasons else "none",
        bundle=bundle.id if bundle and evaluation.elapsed_us else None,
        seconds=time.perf_counter() - started,
        policy_seconds=evaluation.elapsed_us / 1e6, mode=mode)
    if tracing.enabled():
        from opentelemetry import trace

        trace.get_current_span().set_attributes({
            "cosigner.decision_id": final["decision_id"], "cosigner.effect": effect})


async def record_refusal(deps: AppContext, caller: Caller, *, code: str, detail: str,
                         request_id: str | None = None, tool: str | None = None,
                         run_id: str | None = None) -> None:
    """Log a refused request (422/409) like any decision; best effort when storage fails.

    ``detail`` must not contain argument values (masking, invariant 10).
    """
    event = Event(type="request.refused", actor=caller.actor(), run_id=run_id, tool=tool,
                  effect="refused",
                  payload={"request_id": request_id, "code": code, "detail": detail[:500]})
    try:
        async with deps.db.transaction() as conn:
            await append(conn, caller.tenant, [event], now=deps.clock())
    except Exception:  # noqa: BLE001 - the refusal itself is what the caller gets
        log.exception("could not record refused request %s", request_id)

