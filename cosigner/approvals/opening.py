"""Opening approval requests: from a ``require_approval`` decision, or on a runtime's request.

An identical request (same tenant, run, tool, args hash) while one is pending joins it: same
id, no new notification, as long as the twin was opened for the same initiator and
principal, hides at least the current mask and asks at least what the new requirement
asks. Otherwise the twin is superseded (cancelled, its reviews voided) and a new request
opens with the new requirement (:mod:`cosigner.approvals.superseding`): a join never
weakens the current policy. The
partial unique index ``uq_approvals_pending_call`` settles two concurrent openings across
replicas; the loser's insert does nothing and it joins the winner. A pending twin already
past ``expires_at`` ends its stage first (expiry wins): escalated, it is joined (if its new
stage covers the requirement); expired, a new request opens.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, select, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.approvals.joining import PENDING_CALL, join_raw
from cosigner.approvals.requests import (
    SYSTEM_ACTOR,
    event,
    expire,
    is_due,
    load,
    notify,
    permit_of,
    reviews_of,
)
from cosigner.approvals.superseding import join_refusal, successor, supersede
from cosigner.approvals.views import view
from cosigner.audit.chain import Event, append
from cosigner.audit.masking import mask_value
from cosigner.core.canonical import canonicalize
from cosigner.core.errors import Conflict, InvalidRequest, NotFound, PolicyError
from cosigner.core.ids import new_id
from cosigner.db import response_row
from cosigner.db.batch import NeedsCore
from cosigner.db.database import dialect_insert
from cosigner.db.raw_insert import raw_sqlite
from cosigner.db.raw_sql import RawStatement
from cosigner.db.tables import decisions
from cosigner.db.tables_approvals import approvals
from cosigner.identity.principals import Caller
from cosigner.permits import ledger as permit_ledger
from cosigner.policy.result import ApprovalRequirement
from cosigner.webhooks import outbox

if TYPE_CHECKING:
    from cosigner.context import AppContext
    from cosigner.core.settings import Settings

__all__ = ["CallFacts", "open_request", "open_request_raw", "record_gate", "record_gate_raw",
           "request_review"]


@dataclass(frozen=True, slots=True)
class CallFacts:
    """The call an approval request is about, as the server recorded it."""

    tenant: str
    decision_id: str
    run_id: str
    tool: str
    args: dict[str, Any]
    args_hash: str
    mask: tuple[str, ...]
    initiator: dict[str, Any]
    principal: dict[str, Any]
    policy: dict[str, str] | None
    reasons: list[dict[str, str]]


_PENDING_FOR_CALL = select(approvals).where(*PENDING_CALL)


async def _pending_for_call(conn: AsyncConnection, call: CallFacts) -> Any:
    query = _PENDING_FOR_CALL
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return (await conn.execute(query, {
        "tenant": call.tenant, "run_id": call.run_id, "tool": call.tool,
        "args_hash": call.args_hash})).first()


@lru_cache(maxsize=2)
def _insert_pending(dialect: str) -> Any:
    """``INSERT INTO approvals ... ON CONFLICT (pending twin) DO NOTHING RETURNING id``,
    built once per dialect (values are bound per call, so the compiled form is reused)."""
    insert = dialect_insert(dialect)
    return insert(approvals).on_conflict_do_nothing(
        index_elements=["tenant", "run_id", "tool", "args_hash"],
        index_where=text("status = 'pending'"),
    ).returning(approvals.c.id)


#: The columns :func:`open_request` inserts (every column without a server default).
_OPEN_COLUMNS = ("id", "tenant", "kind", "decision_id", "run_id", "tool", "args_hash", "args",
                 "mask", "requirement", "status", "initiator", "principal", "opened_by",
                 "reasons", "policy", "reason", "created_at", "expires_at")
_INSERT_PENDING_RAW = RawStatement(sqlite_insert(approvals).values(
    {name: bindparam(name) for name in _OPEN_COLUMNS}).on_conflict_do_nothing(
    index_elements=["tenant", "run_id", "tool", "args_hash"],
    index_where=text("status = 'pending'")).returning(approvals.c.id))


async def _insert(conn: AsyncConnection, values: dict[str, Any]) -> bool:
    """Insert the pending request unless its twin is pending (True when inserted); on
    SQLite on the batch's own ``sqlite3`` connection, else through Core."""
    raw = await raw_sqlite(conn)
    if raw is not None:
        return bool(_INSERT_PENDING_RAW.run(raw, conn.dialect, values)[0])
    return (await conn.execute(_insert_pending(conn.dialect.name), values)).first() is not None


def _pending_values(call: CallFacts, requirement: ApprovalRequirement,
                    opened_by: dict[str, Any], now: datetime, kind: str,
                    reason: str | None) -> dict[str, Any]:
    """The ``approvals`` row of a new pending request (:data:`_OPEN_COLUMNS`)."""
    mask = list(call.mask)
    return {
        "id": new_id(), "tenant": call.tenant, "kind": kind, "decision_id": call.decision_id,
        "run_id": call.run_id, "tool": call.tool, "args_hash": call.args_hash,
        # Stored masked (invariant 10 at rest, like call_inputs); the hash binds.
        "args": canonicalize(mask_value(call.args, mask)).decode(),
        "mask": mask,
        "requirement": requirement.as_dict(), "status": "pending",
        "initiator": call.initiator, "principal": call.principal, "opened_by": opened_by,
        "reasons": call.reasons, "policy": call.policy, "reason": reason, "created_at": now,
        "expires_at": now + timedelta(milliseconds=requirement.timeout_ms)}


def _opened(values: dict[str, Any], requirement: ApprovalRequirement, settings: Settings,
            now: datetime) -> tuple[Any, dict[str, Any], Event]:
    """``(row, brief view, approval.requested event)`` of the request ``values`` opened."""
    row = SimpleNamespace(**values, stage=1, decided_at=None, permit_jti=None, permit=None)
    requested = event("approval.requested", row, values["opened_by"], kind=values["kind"],
                      requirement=requirement.as_dict(),
                      expires_at=values["expires_at"].isoformat(), reason=values["reason"])
    return row, view(row, [], public_url=settings.public_url, now=now, brief=True), requested


def open_request_raw(raw: sqlite3.Connection, dialect: Dialect, settings: Settings, *,
                     call: CallFacts, requirement: ApprovalRequirement,
                     opened_by: dict[str, Any], now: datetime
                     ) -> tuple[dict[str, Any], list[Event]]:
    """:func:`open_request` (kind ``policy``) on a raw batch transaction's ``sqlite3``
    connection, for its common cases: a new request with no webhook to queue, or a join
    of a pending twin that is not due (:func:`cosigner.approvals.joining.join_raw`).

    Raises:
        NeedsCore: a new request and the tenant has webhook receivers (a join notifies
            nobody), a due twin to expire or escalate first, or a twin to supersede
            (:func:`open_request` does all three).
    """
    values = _pending_values(call, requirement, opened_by, now, "policy", None)
    if not _INSERT_PENDING_RAW.run(raw, dialect, values)[0]:
        return join_raw(raw, dialect, tenant=call.tenant, run_id=call.run_id,
                        tool=call.tool, args_hash=call.args_hash,
                        decision_id=call.decision_id, requirement=requirement,
                        stated=values["requirement"], mask=values["mask"],
                        initiator=values["initiator"], principal=values["principal"],
                        opened_by=opened_by,
                        public_url=settings.public_url, now=now)
    if outbox.targets(settings, call.tenant):
        raise NeedsCore  # undone with the raw transaction: open_request notifies
    _, brief, requested = _opened(values, requirement, settings, now)
    return brief, [requested]


async def open_request(conn: AsyncConnection, settings: Settings, *, call: CallFacts,
                       requirement: ApprovalRequirement, opened_by: dict[str, Any],
                       now: datetime, kind: str = "policy",
                       reason: str | None = None) -> tuple[dict[str, Any], list[Event]]:
    """Open an approval request for ``call`` inside the caller's transaction, or join the
    identical pending one (same tenant, run, tool, args hash): same id, no new request.

    Returns ``(approval object of the Decision, events)``; the events are
    ``approval.requested`` or ``approval.joined`` (preceded by ``approval.expired`` or
    ``approval.escalated`` when the pending twin's stage had run out, and by
    ``approval.superseded`` when the twin may not be joined:
    :func:`cosigner.approvals.superseding.join_refusal`). A concurrent insert of the twin
    is settled by the partial unique index ``uq_approvals_pending_call``: the loser's
    insert does nothing and it joins the winner (or supersedes it). Only a new request
    notifies (webhook ``approval.pending``, queued in this transaction; a superseded twin
    ``approval.decided``).

    Raises:
        Conflict: ``approval_race``, the twin kept changing state under three attempts.
    """
    public_url = settings.public_url
    events: list[Event] = []
    for _ in range(3):
        # Insert first: the partial unique index says whether a pending twin exists, so
        # the common case (a new request) costs one statement and no read.
        values = _pending_values(call, requirement, opened_by, now, kind, reason)
        if await _insert(conn, values):
            return await _open(conn, settings, values, requirement, now, events)
        existing = await _pending_for_call(conn, call)
        if existing is None:
            # The twin left 'pending' while we waited for its row lock: the next INSERT
            # is a new statement and sees it gone (or joins a newer twin).
            continue
        if is_due(existing, now):
            events += await expire(conn, existing, now, SYSTEM_ACTOR, settings=settings)
            existing = await load(conn, call.tenant, existing.id, lock=False)
            if existing.status != "pending":
                continue  # expired: open a new one (escalated: judged at its new stage)
        refusal = join_refusal(existing, requirement, values["requirement"], values["mask"],
                               initiator=values["initiator"], principal=values["principal"])
        if refusal is None:
            break
        superseded = await supersede(conn, settings, existing, superseded_by=values["id"],
                                     decision_id=call.decision_id, actor=opened_by, now=now,
                                     reason=refusal)
        if superseded is None:
            continue  # moved by another writer first (a lock makes this rare)
        events.append(superseded)
        # The twin left the partial unique index in this transaction (a concurrent
        # opener waits for it on the index), so the insert goes in.
        if not await _insert(conn, values):
            raise Conflict("a concurrent approval request changed state; retry",
                           code="approval_race")
        return await _open(conn, settings, values, requirement, now, events)
    else:
        raise Conflict("a concurrent approval request changed state; retry",
                       code="approval_race")
    events.append(event("approval.joined", existing, opened_by,
                         decision_id=call.decision_id))
    rows = await reviews_of(conn, existing.id)
    return view(existing, rows, public_url=public_url, now=now, brief=True), events


async def _open(conn: AsyncConnection, settings: Settings, values: dict[str, Any],
                requirement: ApprovalRequirement, now: datetime,
                events: list[Event]) -> tuple[dict[str, Any], list[Event]]:
    """The answer of :func:`open_request` for the request ``values`` just inserted:
    its ``approval.requested`` event after ``events``, its webhook queued."""
    row, brief, requested = _opened(values, requirement, settings, now)
    await notify(conn, settings, row, "approval.pending", now)
    return brief, [*events, requested]


async def request_review(deps: AppContext, caller: Caller, *, decision_id: str,
                         reason: str) -> dict[str, Any]:
    """A runtime asks for human review of a call the policy allowed.

    The decision's unredeemed permit is revoked (withheld) and a ``runtime_review`` request
    opens with the active bundle's ``[review]`` requirement; once approved a new permit is
    minted. Asking twice for the same decision returns the first request, or when that
    one was superseded the request that replaced it for the same initiator and principal
    (:func:`cosigner.approvals.superseding.successor`; replaced by another party's
    request, the cancelled one naming it), in its current state (with the permit once
    approved).

    Raises:
        Forbidden: caller lacks the ``runtime`` role. NotFound: no such decision in the
        caller's tenant. InvalidRequest ``not_an_allow_decision``, ``shadow_decision``. PolicyError
        ``no_review_requirement`` (the bundle declares no ``[review]``). Conflict
        ``already_redeemed`` (the call already ran).
    """
    caller.require("runtime")
    now = deps.clock()
    async with deps.db.transaction() as conn:
        decision = (await conn.execute(select(decisions).where(
            decisions.c.id == decision_id, decisions.c.tenant == caller.tenant))).first()
        if decision is None:
            raise NotFound("no such decision")
        if decision.effect != "allow":
            raise InvalidRequest("only an allow decision can be sent for review",
                                 code="not_an_allow_decision")
        if (response_row.answer(decision) or {}).get("mode") == "shadow":
            # A shadow decision never yields a usable permit, not even through review.
            raise InvalidRequest("a shadow-mode decision is never enforced; ask again "
                                 "with mode on", code="shadow_decision")
        earlier = (await conn.execute(select(approvals).where(
            approvals.c.tenant == caller.tenant, approvals.c.decision_id == decision_id,
            approvals.c.kind == "runtime_review"))).first()
        if earlier is not None:
            # Superseded since (a stricter decision of the same call, say): the request
            # that holds the review now, as the first answer would have been.
            current = await successor(conn, earlier)
            return view(current, await reviews_of(conn, current.id),
                        public_url=deps.settings.public_url, now=now, include_permit=True,
                        permit_row=await permit_of(conn, current))
        bundle = deps.store.snapshot.bundle_for(caller.tenant)
        requirement = bundle.manifest.review if bundle is not None else None
        if requirement is None:
            raise PolicyError("the active policy bundle declares no [review] requirement",
                              code="no_review_requirement")
        stored = await permit_ledger.load_call_input(conn, caller.tenant, decision_id)
        if stored is None:
            raise PolicyError("the decision's input was not recorded", code="policy_error")
        input_doc, mask = stored
        events = await permit_ledger.withhold(conn, tenant=caller.tenant,
                                              decision_id=decision_id, now=now,
                                              actor=caller.actor())
        call = CallFacts(
            tenant=caller.tenant, decision_id=decision_id, run_id=decision.run_id,
            tool=decision.tool, args=input_doc["args"], args_hash=decision.args_hash,
            mask=tuple(mask), initiator=input_doc["initiator"],
            principal=input_doc["principal"], policy=bundle.ref() if bundle else None,
            reasons=[{"code": "review_requested", "message": reason[:500]}])
        brief, opened = await open_request(
            conn, deps.settings, call=call, requirement=requirement, opened_by=caller.actor(),
            now=now, kind="runtime_review", reason=reason[:500])
        await append(conn, caller.tenant, events + opened, now=now)
        row = await load(conn, caller.tenant, brief["id"], lock=False)
        return view(row, await reviews_of(conn, row.id), public_url=deps.settings.public_url,
                    now=now, include_permit=True)


async def record_gate(conn: AsyncConnection, settings: Settings, caller: Caller, *,
                      response: dict[str, Any], requirement: ApprovalRequirement,
                      input_doc: dict[str, Any], mask: tuple[str, ...],
                      now: datetime) -> list[Event]:
    """Open or join the approval request of a ``require_approval`` decision, in the
    decision plan's transaction (:meth:`cosigner.decisions.plan.DecisionPlan.apply`, after
    it stored the call input). ``response["approval"]`` becomes the request's brief state.
    Returns the approval events."""
    response["approval"], events = await open_request(
        conn, settings, call=_gate_call(caller, response, input_doc, mask),
        requirement=requirement, opened_by=caller.actor(), now=now)
    return events


def record_gate_raw(raw: sqlite3.Connection, dialect: Dialect, settings: Settings,
                    caller: Caller, *, response: dict[str, Any],
                    requirement: ApprovalRequirement, input_doc: dict[str, Any],
                    mask: tuple[str, ...], now: datetime) -> list[Event]:
    """:func:`record_gate` on a raw batch transaction (:func:`open_request_raw`).

    Raises:
        NeedsCore: as :func:`open_request_raw`.
    """
    response["approval"], events = open_request_raw(
        raw, dialect, settings, call=_gate_call(caller, response, input_doc, mask),
        requirement=requirement, opened_by=caller.actor(), now=now)
    return events


def _gate_call(caller: Caller, response: dict[str, Any], input_doc: dict[str, Any],
               mask: tuple[str, ...]) -> CallFacts:
    return CallFacts(
        tenant=caller.tenant, decision_id=response["decision_id"],
        run_id=input_doc["run"]["id"], tool=input_doc["tool"]["name"],
        args=input_doc["args"], args_hash=response["args_hash"], mask=mask,
        initiator=input_doc["initiator"], principal=input_doc["principal"],
        policy=response["policy"], reasons=response["reasons"])
