"""Whether a pending request covers a new requirement (cosigner.approvals.superseding.covers,
pure): a join is allowed only when the twin asks at least what the new requirement asks,
respect by respect."""

from __future__ import annotations

from typing import Any

import pytest

from cosigner.approvals.superseding import covers, masks_cover
from cosigner.policy.result import ApprovalRequirement, parse_requirement

BASE: dict[str, Any] = {"require": [{"role": "finance", "count": 2}], "timeout_ms": 600_000,
                        "distinct_from": "initiator_and_previous"}


def req(**changes: Any) -> ApprovalRequirement:
    return parse_requirement({**BASE, **changes})


def stage(role: str, timeout_ms: int = 60_000, **more: Any) -> dict[str, Any]:
    return {"require": [{"role": role, "count": 1}], "timeout_ms": timeout_ms,
            "distinct_from": "initiator", **more}


# (held by the pending twin, asked by the new decision, covered?)
CASES: list[tuple[str, dict[str, Any], dict[str, Any], bool]] = [
    ("equal", {}, {}, True),
    ("lower count", {}, {"require": [{"role": "finance", "count": 1}]}, True),
    ("higher count", {}, {"require": [{"role": "finance", "count": 3}]}, False),
    ("added group", {}, {"require": [{"role": "finance", "count": 2},
                                      {"role": "security", "count": 1}]}, False),
    ("twin has an extra group", {"require": [{"role": "finance", "count": 2},
                                             {"role": "security", "count": 1}]}, {}, True),
    ("another role", {}, {"require": [{"role": "legal", "count": 1}]}, False),
    ("fewer finance but security", {}, {"require": [{"role": "finance", "count": 1},
                                                    {"role": "security", "count": 1}]}, False),
    ("weaker distinct_from", {}, {"distinct_from": "previous"}, True),
    ("stricter distinct_from", {"distinct_from": "previous"}, {}, False),
    ("other distinct_from", {"distinct_from": "previous"}, {"distinct_from": "initiator"},
     False),
    ("longer timeout", {}, {"timeout_ms": 1_200_000}, True),
    ("shorter timeout", {}, {"timeout_ms": 60_000}, False),
    ("signature asked", {}, {"signature": "webauthn"}, False),
    ("signature held", {"signature": "webauthn"}, {}, True),
    ("mfa asked", {}, {"assurance": "mfa"}, False),
    ("mfa held", {"assurance": "mfa"}, {}, True),
    ("min_acr asked", {}, {"min_acr": "gold"}, False),
    ("other min_acr", {"min_acr": "silver"}, {"min_acr": "gold"}, False),
    ("same min_acr", {"min_acr": "gold"}, {"min_acr": "gold"}, True),
    ("auth age asked", {}, {"max_auth_age_s": 300}, False),
    ("fresher auth age asked", {"max_auth_age_s": 600}, {"max_auth_age_s": 300}, False),
    ("fresher auth age held", {"max_auth_age_s": 300}, {"max_auth_age_s": 600}, True),
    ("break-glass forbidden", {}, {"break_glass": False}, False),
    ("break-glass forbidden by the twin", {"break_glass": False}, {}, True),
    ("standing forbidden", {"standing": {"max_ttl_s": 60, "max_uses": 2}}, {}, False),
    ("standing narrower", {"standing": {"max_ttl_s": 60, "max_uses": 2}},
     {"standing": {"max_ttl_s": 60, "max_uses": 1}}, False),
    ("standing within", {"standing": {"max_ttl_s": 60, "max_uses": 2}},
     {"standing": {"max_ttl_s": 120, "max_uses": 2}}, True),
    ("standing held only by the new", {}, {"standing": {"max_ttl_s": 60, "max_uses": 2}},
     True),
    ("escalation the new lacks", {"on_expired": stage("manager")}, {}, False),
    ("no escalation, the new escalates", {}, {"on_expired": stage("manager")}, True),
    ("same escalation", {"on_expired": stage("manager")}, {"on_expired": stage("manager")},
     True),
    ("weaker escalation", {"on_expired": stage("manager")},
     {"on_expired": stage("manager", assurance="mfa")}, False),
    ("longer escalation stage", {"on_expired": stage("manager", 120_000)},
     {"on_expired": stage("manager")}, False),
]


@pytest.mark.parametrize(("held", "asked", "covered"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_covers_respect_by_respect(held: dict[str, Any], asked: dict[str, Any],
                                   covered: bool) -> None:
    assert covers(req(**held), req(**asked)) is covered


def test_a_later_stage_is_compared_with_the_same_stage_of_the_new_chain() -> None:
    chain = req(timeout_ms=60_000, on_expired=stage("manager"))
    second = parse_requirement(stage("manager"))  # the twin at stage 2, as stored
    assert covers(second, chain, stage=2, elapsed_ms=60_000)
    # escalated sooner than the new chain's first stage allows
    assert not covers(second, chain, stage=2, elapsed_ms=59_999)
    # the new chain has no second stage
    assert not covers(second, req(), stage=2, elapsed_ms=600_000)
    # its second stage asks another role
    assert not covers(second, req(timeout_ms=60_000, on_expired=stage("director")),
                      stage=2, elapsed_ms=60_000)


@pytest.mark.parametrize(("held", "asked", "covered"), [
    ([], [], True),
    (["/a"], [], True),
    (["/a", "/b"], ["/b", "/a"], True),
    (["/a"], ["/a/b"], True),  # /a hides everything under it
    ([], ["/a"], False),  # the twin shows /a: the current policy hides it
    (["/a/b"], ["/a"], False),
    (["/ab"], ["/a"], False),
    (["/a"], ["/ab"], False),  # not under /a
    (["/a"], ["/a", "/c"], False),
    (None, ["/a"], False),
])
def test_a_twin_must_hide_what_the_current_policy_hides(held: Any, asked: list[str],
                                                        covered: bool) -> None:
    assert masks_cover(held, asked) is covered


def test_join_refusal_names_its_reason() -> None:
    from types import SimpleNamespace

    from cosigner.approvals.superseding import join_refusal

    agent, user = {"id": "agent-1", "type": "agent"}, {"id": "u", "type": "user"}
    customer = {"id": "c-1", "type": "customer"}
    stated = req().as_dict()
    twin = SimpleNamespace(requirement=stated, mask=["/a"], initiator=agent,
                           principal=customer, stage=1)
    same = {"initiator": agent, "principal": customer}
    assert join_refusal(twin, req(), stated, ["/a"], **same) is None
    assert join_refusal(twin, req(), stated, ["/a"]) is None  # parties not compared
    assert join_refusal(twin, req(), stated, ["/a"], initiator=user,
                        principal=customer) == "other_party"
    assert join_refusal(twin, req(), stated, ["/a"], initiator=agent,
                        principal={"id": "c-2", "type": "customer"}) == "other_party"
    assert join_refusal(twin, req(), stated, ["/a", "/b"], **same) == "mask_widened"
    stricter = req(require=[{"role": "finance", "count": 3}])
    assert join_refusal(twin, stricter, stricter.as_dict(), ["/a"],
                        **same) == "requirement_raised"
