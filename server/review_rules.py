"""Separation-of-duties rules and quorum counting for approval reviews (pure functions).

DESIGN invariant 6: a reviewer must hold a required role; with ``distinct_from`` including
``initiator`` they differ from the initiator and the principal; with ``previous`` they differ
from every approver already accepted in this run; one stable subject counts once toward the
whole requirement, even across role groups. The runtime credential that opened a request is
never one of its reviewers, whatever ``distinct_from`` says: the requesting side cannot
approve itself (case K13). Every comparison of two subjects is of their canonical forms
(:func:`server.subjects.subject_key`), so ``Alice@Corp.Example`` is ``alice@corp.example``
here too, whoever spelt the initiator or principal id (case K29).

Counting across groups is a bipartite matching of approving subjects to role slots (a group
``{role, count}`` is ``count`` slots). Earlier reviewers are matched first, and a new
approval is accepted only when it grows the matching, so a person holding two roles is
counted where they are needed, never twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from server.policy.result import ApprovalRequirement, RoleGroup
from server.subjects import subject_key


@dataclass(frozen=True, slots=True)
class ReviewContext:
    """What the rules need to know about one approval request."""

    requirement: ApprovalRequirement
    initiator_id: str
    principal_id: str
    opened_by: str  # subject of the runtime credential that opened the request
    previous_approvers: frozenset[str]  # approvers accepted on other requests of this run
    reviewed: frozenset[str]  # subjects who already reviewed this request


def required_roles(requirement: ApprovalRequirement) -> frozenset[str]:
    return frozenset(group.role for group in requirement.require)


def refusal_code(ctx: ReviewContext, *, subject: str, roles: Iterable[str],
                 decision: str) -> str | None:
    """The code refusing ``subject``'s review, or ``None`` when the rules allow it.

    Codes, in the order checked: ``not_eligible`` (holds no required role),
    ``self_approval`` (the opener; the initiator or principal when ``distinct_from``
    includes ``initiator``), ``previous_approver`` (approvals only, with ``previous``),
    ``duplicate_review``. Quorum fit (``role_already_met``) is :func:`match`'s job.
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


def match(candidates: Sequence[tuple[str, frozenset[str]]],
          groups: Sequence[RoleGroup]) -> dict[str, str]:
    """Assign approving subjects to role slots: ``{subject: role counted}``.

    ``candidates`` are ``(subject, required roles held)`` in review order; a subject
    (canonical, as stored) appears at most once. Kuhn's augmenting paths give a maximum
    matching; a subject left out counts toward nothing.
    """
    slots = [group.role for group in groups for _ in range(group.count)]
    owner: list[str | None] = [None] * len(slots)
    roles_of = dict(candidates)

    def augment(subject: str, seen: set[int]) -> bool:
        for index, role in enumerate(slots):
            if role in roles_of[subject] and index not in seen:
                seen.add(index)
                current = owner[index]
                if current is None or augment(current, seen):
                    owner[index] = subject
                    return True
        return False

    for subject, _ in candidates:
        augment(subject, set())
    return {who: slots[i] for i, who in enumerate(owner) if who is not None}


def progress(groups: Sequence[RoleGroup], assignment: dict[str, str]) -> list[dict[str, object]]:
    """Per group: ``{role, count, approved}`` where ``approved`` counts matched people."""
    counted = list(assignment.values())
    return [{"role": g.role, "count": g.count, "approved": min(counted.count(g.role), g.count)}
            for g in groups]


def is_met(groups: Sequence[RoleGroup], assignment: dict[str, str]) -> bool:
    """Every group has ``count`` distinct people (AND across groups)."""
    counted = list(assignment.values())
    return all(counted.count(g.role) >= g.count for g in groups)


def satisfies(requirement: ApprovalRequirement, counted_roles: Iterable[str]) -> bool:
    """Would reviews counted for ``counted_roles`` meet ``requirement``? (redeem re-check)"""
    counted = list(counted_roles)
    return all(counted.count(g.role) >= g.count for g in requirement.require)
