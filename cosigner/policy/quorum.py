"""Quorum counting for an approval requirement (pure functions).

A requirement is met when every role group has ``count`` distinct people (AND across
groups), and one person (one stable subject) counts once toward the whole requirement,
even when they hold roles of several groups (DESIGN invariant 6). Counting is a bipartite
matching of approving subjects to role slots (a group ``{role, count}`` is ``count``
slots); earlier reviewers are matched first, and a new approval is accepted only when it
grows the matching, so a person holding two roles is counted where they are needed,
never twice. Separation-of-duties refusals are :mod:`cosigner.approvals.rules`.
"""

from __future__ import annotations

from collections.abc import Sequence

from cosigner.policy.result import DISTINCT_PARTS, ApprovalRequirement, RoleGroup


def required_roles(requirement: ApprovalRequirement) -> frozenset[str]:
    return frozenset(group.role for group in requirement.require)


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
    return _counts_met(groups, list(assignment.values()))


def _counts_met(groups: Sequence[RoleGroup], counted: list[str]) -> bool:
    """Every group's ``count`` is met by ``counted``, the role each person counts for."""
    return all(counted.count(g.role) >= g.count for g in groups)


def judged_as_strictly(held: ApprovalRequirement, asked: ApprovalRequirement) -> bool:
    """Does stage ``held`` judge each review at least as strictly as stage ``asked``: a
    signature wherever ``asked`` asks one (same kind), at least ``asked``'s
    ``distinct_from`` rules, the same ``assurance`` and ``min_acr``, a ``max_auth_age_s``
    no longer? Counts and timing aside (pure)."""
    groups = {g.role: g for g in held.require}
    for group in asked.require:
        mine = groups.get(group.role)
        if group.signature is not None and (mine is None or mine.signature != group.signature):
            return False
    if not DISTINCT_PARTS[asked.distinct_from] <= DISTINCT_PARTS[held.distinct_from]:
        return False
    if asked.assurance is not None and held.assurance != asked.assurance:
        return False
    # Two acr values are ordered only by the tenant's settings: a different one is no cover.
    if asked.min_acr is not None and held.min_acr != asked.min_acr:
        return False
    return asked.max_auth_age_s is None or (
        held.max_auth_age_s is not None and held.max_auth_age_s <= asked.max_auth_age_s)


def reviews_still_meet(current: ApprovalRequirement, roles: Sequence[str],
                       held: ApprovalRequirement | None, elapsed_ms: int = 0) -> bool:
    """Redeem's time-of-use check of an approved permit: do the reviews that approved it
    meet ``current`` (the active policy's requirement for the call) or one of the stages
    it escalates to, under no looser terms?

    ``roles``: the counted reviews' roles, one per review, of the stage that approved the
    request; ``held``: that stage's requirement as stored with the request (the rules the
    reviews were judged by; ``None`` unknown: no review counted). A stage of ``current``
    is met when every group's count is met by ``roles`` (one person counts once: each
    review holds one role) and ``held`` judged the reviews at least as strictly: signed
    wherever the stage asks a signature, at least its ``distinct_from`` rules, the same
    step-up (assurance, ``min_acr``) and an authentication at most its ``max_auth_age_s``
    old. A policy that tightens any of these after the approval refuses the permit
    (``policy_changed``) instead of letting reviews judged under the old rules authorise
    the call.

    ``elapsed_ms``: from the request's opening to its earliest counted review. A later
    stage of ``current`` counts only for reviews given no sooner than ``current`` would
    have opened it (the sum of the earlier stages' timeouts): a policy that tightens its
    first stage and keeps the old rules for a stage it escalates to later does not let
    reviews given at once, under the old rules, through (as
    :func:`cosigner.approvals.superseding.covers` compares an escalated request). Pure."""
    if held is None:
        return False
    counted = list(roles)
    opens_ms = 0
    for stage in current.stages():
        if opens_ms > elapsed_ms:
            return False
        if _counts_met(stage.require, counted) and judged_as_strictly(held, stage):
            return True
        opens_ms += stage.timeout_ms
    return False
