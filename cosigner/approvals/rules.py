"""Separation-of-duties rules for approval reviews (pure functions).

DESIGN invariant 6: a reviewer must hold a required role; with ``distinct_from`` including
``initiator`` they differ from the initiator and the principal; with ``previous`` they differ
from every approver already accepted in this run (:func:`counts_as_previous`: whatever the
request they approved became); one stable subject counts once toward the
whole requirement, even across role groups. The runtime credential that opened a request is
never one of its reviewers, whatever ``distinct_from`` says: the requesting side cannot
approve itself (case K13). Every comparison of two subjects is of their canonical forms
(:func:`cosigner.core.subjects.subject_key`), so ``Alice@Corp.Example`` is
``alice@corp.example`` here too, whoever spelt the initiator or principal id (case K29).

Quorum counting (one subject counts once across groups) is :mod:`cosigner.policy.quorum`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cosigner.core.subjects import subject_key
from cosigner.policy.quorum import required_roles
from cosigner.policy.result import ApprovalRequirement


@dataclass(frozen=True, slots=True)
class ReviewContext:
    """What the rules need to know about one approval request."""

    requirement: ApprovalRequirement
    initiator_id: str
    principal_id: str
    opened_by: str  # subject of the runtime credential that opened the request
    # approvers accepted on other requests of this run (counts_as_previous)
    previous_approvers: frozenset[str]
    reviewed: frozenset[str]  # subjects who already reviewed this request


def counts_as_previous(*, voided: bool, same_call: bool) -> bool:
    """Does an approval given on another request of the run count as a ``previous``
    approval for a request of this run?

    Yes, whatever that request became — approved, or ended without effect (expired,
    cancelled, rejected by someone else): the conservative reading of "distinct from
    earlier approvers in the run", under which a request ending never frees its approvers
    (for the run's other calls, nor for the same call asked again). The one exception:
    an approval ``voided`` by superseding (:mod:`cosigner.approvals.superseding`) does not
    count toward a request of the ``same_call`` (tenant, run, tool, args hash): the
    request that replaced it asks for exactly what the person approved, under stricter
    rules, and its approvers review it again. Toward the run's other calls it counts like
    any other. Pure."""
    return not (voided and same_call)


def refusal_code(ctx: ReviewContext, *, subject: str, roles: Iterable[str],
                 decision: str) -> str | None:
    """The code refusing ``subject``'s review, or ``None`` when the rules allow it.

    Codes, in the order checked: ``not_eligible`` (holds no required role),
    ``self_approval`` (the opener; the initiator or principal when ``distinct_from``
    includes ``initiator``), ``previous_approver`` (approvals only, with ``previous``),
    ``duplicate_review``. Quorum fit (``role_already_met``) is
    :func:`cosigner.policy.quorum.match`'s job.
    """
    if not required_roles(ctx.requirement) & frozenset(roles):
        return "not_eligible"
    distinct = ctx.requirement.distinct_from
    me = subject_key(subject)
    if me == subject_key(ctx.opened_by):
        return "self_approval"
    if distinct in ("initiator", "initiator_and_previous") and me in (
            subject_key(ctx.initiator_id), subject_key(ctx.principal_id)):
        return "self_approval"
    if (decision == "approved" and distinct in ("previous", "initiator_and_previous")
            and me in {subject_key(s) for s in ctx.previous_approvers}):
        return "previous_approver"
    if me in {subject_key(s) for s in ctx.reviewed}:
        return "duplicate_review"
    return None
