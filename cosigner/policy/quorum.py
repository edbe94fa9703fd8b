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

from collections.abc import Iterable, Sequence

from cosigner.policy.result import ApprovalRequirement, RoleGroup


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
    counted = list(assignment.values())
    return all(counted.count(g.role) >= g.count for g in groups)


def satisfies(requirement: ApprovalRequirement, counted_roles: Iterable[str]) -> bool:
    """Would reviews counted for ``counted_roles`` (of one stage) meet ``requirement`` or
    one of the stages it escalates to? (redeem re-check)"""
    counted = list(counted_roles)
    return any(all(counted.count(g.role) >= g.count for g in stage.require)
               for stage in requirement.stages())
