"""Whether a pending request may be joined, and superseding it when it may not.

A ``require_approval`` decision whose call (tenant, run, tool, args hash) already has a
pending request joins it (:func:`cosigner.approvals.opening.open_request`) only when the
twin was opened for the same initiator and principal, hides at least the arguments the
current policy masks, and asks at least what the decision's own requirement asks
(:func:`join_refusal`, :func:`covers`): a join must never weaken the current policy.
Otherwise the twin is **superseded**: moved to
``cancelled`` (:func:`cosigner.approvals.requests.transition`; terminal, like any
cancellation) with an ``approval.superseded`` event naming the request that replaces it
(``superseded_by`` on the twin too, for its readers to follow: :func:`successor`),
and a new request opens with the decision's requirement, exactly as if there had been no
twin. Reviews already given on the twin were judged against the twin's rules (its groups,
``distinct_from``, step-up, signatures), so none is carried over: each is voided (its
``role`` cleared: it counts for no group, nor as a ``previous`` approval toward the new
request, which asks for the very call it approved; toward the run's other calls it still
counts, :func:`cosigner.approvals.rules.counts_as_previous`) and listed in the event; the
approvers review the new request. The same rule serves every opener: decisions, runtime
reviews, program barriers.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.approvals.requests import (
    aware,
    event,
    load,
    notify,
    reviews_of,
    stage_of,
    transition,
)
from cosigner.audit.chain import Event
from cosigner.db.tables_approvals import reviews
from cosigner.policy.quorum import judged_as_strictly
from cosigner.policy.result import ApprovalRequirement, parse_requirement

if TYPE_CHECKING:
    from cosigner.core.settings import Settings

__all__ = ["REASON", "covers", "join_refusal", "masks_cover", "supersede", "successor"]

#: ``reason`` of an ``approval.superseded`` event whose twin asked less (the others:
#: :func:`join_refusal`).
REASON = "requirement_raised"

def _stage_covers(held: ApprovalRequirement, asked: ApprovalRequirement) -> bool:
    """Every approval meeting stage ``held`` meets stage ``asked``, and ``held``'s
    escalations are no weaker than ``asked``'s (pure)."""
    groups = {g.role: g for g in held.require}
    for group in asked.require:
        mine = groups.get(group.role)
        if mine is None or mine.count < group.count:
            return False  # (a group of held's own only asks more of the same approvals)
    if not judged_as_strictly(held, asked):
        return False
    if held.timeout_ms > asked.timeout_ms:
        return False
    # A stage that escalates must last exactly as long: ending sooner, its next stage
    # (another group, often a looser one) would be open while ``asked`` still holds its
    # reviewers to this one.
    if held.on_expired is not None and held.timeout_ms != asked.timeout_ms:
        return False
    if held.on_expired is None:
        return True  # expiring is stricter than any escalation
    return asked.on_expired is not None and _stage_covers(held.on_expired, asked.on_expired)


def covers(held: ApprovalRequirement, asked: ApprovalRequirement, *, stage: int = 1,
           elapsed_ms: int = 0) -> bool:
    """Does a pending request at ``stage`` (1 = first) with requirement ``held`` (that
    stage's, as stored) ask at least what a new request with requirement ``asked`` would?

    ``elapsed_ms``: from the request's opening to the start of its ``stage``. Compared
    respect by respect, so that any approval meeting ``held`` meets ``asked`` under no
    looser terms: per role group of ``asked`` a group of ``held`` with at least its count
    (signed where it is); at least ``asked``'s ``distinct_from`` rules; a timeout no longer
    (the same where the stage escalates: its next stage must not open sooner);
    the same ``assurance`` and ``min_acr``, a ``max_auth_age_s`` no longer; no escalation
    ``asked`` lacks (each later stage compared the same way); break-glass only if ``asked``
    allows it; standing approvals only within ``asked``'s bounds. A request past its first
    stage is compared with ``asked``'s stage of the same number, and only if its earlier
    stages lasted at least as long as ``asked``'s (it did not escalate sooner). Pure.
    """
    chain = asked.stages()
    if stage > len(chain):
        return False
    if elapsed_ms < sum(s.timeout_ms for s in chain[:stage - 1]):
        return False
    if held.break_glass and not asked.break_glass:
        return False
    if held.standing is not None and (
            asked.standing is None or held.standing.max_ttl_s > asked.standing.max_ttl_s
            or held.standing.max_uses > asked.standing.max_uses):
        return False
    return _stage_covers(held, chain[stage - 1])


def join_refusal(twin: Any, asked: ApprovalRequirement, stated: dict[str, Any],
                 mask: list[str] | tuple[str, ...] = (), *,
                 initiator: dict[str, Any] | None = None,
                 principal: dict[str, Any] | None = None) -> str | None:
    """Why a decision needing ``asked`` (``stated``: its :meth:`as_dict`, as it would be
    stored), with argument ``mask`` (JSON pointers under ``args``), proposed by
    ``initiator`` on behalf of ``principal``, may not join pending request ``twin`` (a row
    with ``requirement``, ``mask``, ``initiator``, ``principal``, ``stage``,
    ``created_at``, ``expires_at``, not due); ``None`` when it may.

    Reasons (the ``approval.superseded`` event's ``reason``): ``other_party``: the twin was
    opened for another initiator or principal, whom separation of duties compared its
    approvers with (an approver who proposed this call could otherwise approve the twin);
    ``mask_widened``: the twin hides less of the arguments than the current policy
    (:func:`masks_cover`; its approver page shows its own stored arguments, invariant 10);
    ``requirement_raised``: the twin asks less (:func:`covers`). ``initiator`` and
    ``principal`` ``None``: not compared. The common retry, the same parties, mask and
    requirement at the first stage, is four comparisons of stored values."""
    if (initiator is not None and twin.initiator != initiator) or (
            principal is not None and twin.principal != principal):
        return "other_party"
    if not masks_cover(twin.mask, mask):
        return "mask_widened"
    stage = stage_of(twin)
    if stage == 1 and twin.requirement == stated:
        return None
    held = parse_requirement(twin.requirement)
    elapsed_ms = 0
    if stage > 1:  # the current stage began where the last one ended (requests.expire)
        started = aware(twin.expires_at) - timedelta(milliseconds=held.timeout_ms)
        elapsed_ms = (started - aware(twin.created_at)) // timedelta(milliseconds=1)
    return None if covers(held, asked, stage=stage, elapsed_ms=elapsed_ms) else REASON


def masks_cover(held: Any, asked: Any) -> bool:
    """Every JSON pointer (RFC 6901) of ``asked`` is one of ``held`` or lies under one
    (``/a`` hides ``/a/b``): a request stored with mask ``held`` hides at least what
    ``asked`` hides. Pure."""
    if not asked or list(held or ()) == list(asked):
        return True
    kept = set(held or ())
    return all(path in kept or any(path.startswith(p + "/") for p in kept)
               for path in asked)


async def supersede(conn: AsyncConnection, settings: Settings, twin: Any, *,
                    superseded_by: str, decision_id: str, actor: dict[str, Any],
                    now: datetime, reason: str = REASON) -> Event | None:
    """Cancel pending request ``twin`` (locked by the caller) in favour of request
    ``superseded_by``, which decision ``decision_id`` (of ``actor``) is about to open
    because the twin may not be joined (``reason``, :func:`join_refusal`); record the
    successor on the twin (``superseded_by``: its readers follow it, :func:`successor`),
    void its reviews and queue the webhook ``approval.decided`` (status ``cancelled``,
    ``decided_by`` the actor). Returns the ``approval.superseded``
    event, or ``None`` when another writer moved the twin first (nothing written)."""
    given = await reviews_of(conn, twin.id)
    if not await transition(conn, twin, "cancelled", now=now, superseded_by=superseded_by):
        return None
    voided = [{"subject": r.subject, "role": r.role, "stage": int(r.stage or 1)}
              for r in given if r.role is not None]
    if voided:
        await conn.execute(reviews.update().where(
            reviews.c.approval_id == twin.id, reviews.c.role.is_not(None)).values(role=None))
    await notify(conn, settings, twin, "approval.decided", now, status="cancelled",
                 decided_by=[str(actor.get("subject"))])
    return event("approval.superseded", twin, actor, superseded_by=superseded_by,
                 decision_id=decision_id, reason=reason, voided=voided)


async def successor(conn: AsyncConnection, row: Any) -> Any:
    """The request that now holds ``row``'s call for ``row``'s parties: ``row`` itself
    unless it was superseded, else the end of its ``superseded_by`` links (each
    replacement may have been superseded in turn), whatever that request's state.

    The walk stops before a replacement opened for another initiator or principal
    (``other_party``): that request is the other party's, its separation of duties is
    judged against them, so ``row``'s last request of the same parties is the answer
    (``cancelled``, naming the other party's request in ``superseded_by``). Every link
    stays in ``row``'s tenant (a replacement is opened for the same call)."""
    parties = (row.initiator, row.principal)
    while row.superseded_by is not None:
        nxt = await load(conn, row.tenant, row.superseded_by, lock=False)
        if nxt is None or (nxt.initiator, nxt.principal) != parties:
            return row  # (None: never written so; a damaged link ends the walk here)
        row = nxt
    return row
