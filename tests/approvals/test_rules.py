"""The approvals domain without HTTP: state table, review rules, masking, expiry sweep, and
concurrent reviews completing a quorum (exactly one permit)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from cosigner.approvals import requests
from cosigner.approvals import reviews as approvals
from cosigner.approvals import rules as review_rules
from cosigner.approvals.views import MASK, display_args
from cosigner.core.clock import FrozenClock
from cosigner.core.errors import ApprovalStateError, NotFound, ReviewRefused
from cosigner.db.tables import audit_events, permits
from cosigner.db.tables_approvals import approvals as approvals_table
from cosigner.identity.principals import Caller
from cosigner.policy import quorum
from cosigner.policy.result import ApprovalRequirement, RoleGroup
from tests.conftest import Harness
from tests.http.approval_helpers import decide, needs, scripted, write_scripted_bundle

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def requirement(*groups: tuple[str, int], distinct_from: str = "initiator_and_previous"
                ) -> ApprovalRequirement:
    return ApprovalRequirement(tuple(RoleGroup(r, c) for r, c in groups), 60_000,
                               distinct_from)  # type: ignore[arg-type]


def person(tenant: str, subject: str, *roles: str) -> Caller:
    return Caller(tenant=tenant, principal_id=str(uuid.uuid4()), subject=subject,
                  roles=frozenset(roles), kind="key")


# --- the state table ----------------------------------------------------------------------


def test_only_pending_moves_and_terminal_states_never_change() -> None:
    assert requests.TRANSITIONS["pending"] == {"approved", "rejected", "expired",
                                                "cancelled"}
    assert requests.TERMINAL == {"approved", "rejected", "expired", "cancelled"}
    assert set(requests.TRANSITIONS) == set(requests.STATES)


@pytest.mark.parametrize("state", ["approved", "rejected", "expired", "cancelled"])
async def test_transition_refuses_leaving_a_terminal_state(state: str) -> None:
    row = type("Row", (), {"id": "x", "status": state})()
    with pytest.raises(ApprovalStateError):
        await requests.transition(None, row, "approved", now=T0)  # type: ignore[arg-type]


# --- pure review rules --------------------------------------------------------------------


def ctx(req: ApprovalRequirement, **overrides: Any) -> review_rules.ReviewContext:
    values: dict[str, Any] = {
        "requirement": req, "initiator_id": "agent", "principal_id": "customer",
        "opened_by": "runtime-key", "previous_approvers": frozenset(),
        "reviewed": frozenset()}
    values.update(overrides)
    return review_rules.ReviewContext(**values)


@pytest.mark.parametrize(("subject", "roles", "overrides", "decision", "code"), [
    ("alice", {"security"}, {}, "approved", "not_eligible"),
    ("alice", set(), {}, "approved", "not_eligible"),
    ("runtime-key", {"finance"}, {}, "approved", "self_approval"),
    ("agent", {"finance"}, {}, "approved", "self_approval"),
    ("customer", {"finance"}, {}, "rejected", "self_approval"),
    ("alice", {"finance"}, {"previous_approvers": frozenset({"alice"})}, "approved",
     "previous_approver"),
    ("alice", {"finance"}, {"previous_approvers": frozenset({"alice"})}, "rejected", None),
    ("alice", {"finance"}, {"reviewed": frozenset({"alice"})}, "approved",
     "duplicate_review"),
    ("alice", {"finance"}, {}, "approved", None),
])
def test_refusal_codes(subject: str, roles: set[str], overrides: dict[str, Any],
                       decision: str, code: str | None) -> None:
    got = review_rules.refusal_code(ctx(requirement(("finance", 1)), **overrides),
                                    subject=subject, roles=roles, decision=decision)
    assert got == code


def test_distinct_from_previous_does_not_exclude_the_initiator() -> None:
    rules = ctx(requirement(("finance", 1), distinct_from="previous"),
                previous_approvers=frozenset({"bob"}))
    assert review_rules.refusal_code(rules, subject="agent", roles={"finance"},
                                     decision="approved") is None
    assert review_rules.refusal_code(rules, subject="bob", roles={"finance"},
                                     decision="approved") == "previous_approver"
    initiator_only = ctx(requirement(("finance", 1), distinct_from="initiator"),
                         previous_approvers=frozenset({"bob"}))
    assert review_rules.refusal_code(initiator_only, subject="bob", roles={"finance"},
                                     decision="approved") is None


@pytest.mark.parametrize(("voided", "same_call", "counts"), [
    (False, False, True),  # an approval on another call of the run, however it ended
    (False, True, True),  # the same call asked again after its request ended
    (True, False, True),  # voided by superseding, toward another call of the run
    (True, True, False),  # voided, toward the request of its own call that replaced it
])
def test_which_approvals_count_as_previous(voided: bool, same_call: bool,
                                           counts: bool) -> None:
    assert review_rules.counts_as_previous(voided=voided, same_call=same_call) is counts


def test_matching_counts_each_person_once_and_reassigns_when_needed() -> None:
    groups = requirement(("finance", 1), ("security", 1)).require
    both = frozenset({"finance", "security"})
    assert quorum.match([("alice", both)], groups) == {"alice": "finance"}
    assert quorum.match([("alice", both), ("bob", frozenset({"finance"}))], groups) == {
        "alice": "security", "bob": "finance"}
    full = quorum.match([("a", frozenset({"finance"})), ("b", frozenset({"finance"}))],
                              groups)
    assert full == {"a": "finance"}
    assert not quorum.is_met(groups, full)
    assert quorum.progress(groups, full) == [
        {"role": "finance", "count": 1, "approved": 1},
        {"role": "security", "count": 1, "approved": 0}]


def test_reviews_still_meet_for_redeem_recheck() -> None:
    held = requirement(("finance", 1))
    assert quorum.reviews_still_meet(requirement(("finance", 1)), ["finance"], held)
    assert not quorum.reviews_still_meet(requirement(("finance", 2)), ["finance"], held)
    assert not quorum.reviews_still_meet(requirement(("finance", 1), ("security", 1)),
                                         ["finance"], held)
    assert not quorum.reviews_still_meet(requirement(("finance", 1)), ["finance"], None)


def test_reviews_judged_more_loosely_than_the_policy_asks_now_do_not_meet_it() -> None:
    """Counts met, but the approving stage judged its reviews under looser rules than the
    active policy: a signature, more separation of duties, a step-up asked since."""
    loose = requirement(("finance", 1), distinct_from="initiator")
    asked_now = [
        requirement(("finance", 1), distinct_from="initiator_and_previous"),
        replace(requirement(("finance", 1), distinct_from="initiator"),
                require=(RoleGroup("finance", 1, "webauthn"),)),
        replace(requirement(("finance", 1), distinct_from="initiator"), assurance="mfa"),
        replace(requirement(("finance", 1), distinct_from="initiator"), min_acr="gold"),
        replace(requirement(("finance", 1), distinct_from="initiator"), max_auth_age_s=60),
    ]
    for current in asked_now:
        assert not quorum.reviews_still_meet(current, ["finance"], loose), current
        assert quorum.reviews_still_meet(current, ["finance"], current), current
    # Judged more strictly than asked now: still met.
    strict = replace(requirement(("finance", 2), distinct_from="initiator_and_previous"),
                     require=(RoleGroup("finance", 2, "webauthn"),), assurance="mfa",
                     max_auth_age_s=30)
    assert quorum.reviews_still_meet(loose, ["finance"], strict)
    assert not quorum.reviews_still_meet(replace(loose, max_auth_age_s=10), ["finance"],
                                         strict)  # authenticated up to 30 s before


def test_a_stage_the_policy_escalates_to_is_met_under_its_own_rules() -> None:
    """``current`` escalates to a stage the reviews met: met when that stage's rules are
    no stricter than the ones the reviews were judged by, and the reviews came once
    ``current`` would have opened it (after its first stage's 60 s)."""
    manager = requirement(("manager", 1), distinct_from="initiator")
    current = replace(requirement(("finance", 1)), on_expired=manager)
    assert quorum.reviews_still_meet(current, ["manager"], manager, 60_000)
    assert not quorum.reviews_still_meet(current, ["manager"], manager, 59_999)
    assert not quorum.reviews_still_meet(
        replace(current, on_expired=replace(manager, assurance="mfa")), ["manager"], manager,
        60_000)


# --- masking ------------------------------------------------------------------------------


def test_display_args_masks_pointers_and_ignores_missing_paths() -> None:
    args = '{"a/b":1,"card":{"number":"4111","exp":"12/30"},"items":[{"sku":"x"}],"~k":2}'
    shown = display_args(args, ["/card/number", "/items/0/sku", "/a~1b", "/~0k", "/nope/x",
                                "/items/9"])
    assert shown == {"a/b": MASK, "card": {"number": MASK, "exp": "12/30"},
                     "items": [{"sku": MASK}], "~k": MASK}
    assert display_args(args, [""]) == MASK


# --- against a real database --------------------------------------------------------------


@pytest.fixture
async def frozen(harness_factory: Callable[..., Any], tmp_path: Path
                 ) -> tuple[Harness, FrozenClock]:
    clock = FrozenClock(T0)
    h: Harness = await harness_factory(clock=clock,
                                       bundle_dirs=[write_scripted_bundle(tmp_path / "b")])
    return h, clock


async def test_expire_due_sweeps_at_the_instant_and_logs(
        frozen: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, clock = frozen
    runtime = await h.headers(tenant, "runtime")
    decision = await decide(h, runtime, scripted(needs(("finance", 1), timeout_ms=5_000)))
    approval_id = decision["approval"]["id"]
    deps = h.context

    async def stored_status() -> str:
        async with deps.db.read() as conn:
            return str((await conn.execute(select(approvals_table.c.status).where(
                approvals_table.c.id == approval_id))).scalar_one())

    # Swept for this tenant: on the shared PostgreSQL database other tests leave pending
    # rows due long before T0, and a global sweep (500 rows a call) may not reach this one.
    assert await requests.expire_due(
        deps.db, T0 + timedelta(seconds=5, microseconds=-1), tenant=tenant) == 0
    assert await stored_status() == "pending"
    assert await requests.expire_due(deps.db, T0 + timedelta(seconds=5), tenant=tenant) == 1
    assert await stored_status() == "expired"
    assert await requests.expire_due(deps.db, T0 + timedelta(seconds=6), tenant=tenant) == 0
    clock.advance(seconds=5)
    with pytest.raises(ApprovalStateError) as err:
        await approvals.review(deps, person(tenant, "alice", "finance"), approval_id,
                               decision="approved")
    assert err.value.code == "approval_expired"
    async with deps.db.read() as conn:
        expired = (await conn.execute(select(func.count()).select_from(audit_events).where(
            audit_events.c.tenant == tenant,
            audit_events.c.type == "approval.expired"))).scalar_one()
    assert expired == 1


async def test_review_is_the_one_entry_point_for_every_rule(
        frozen: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, _ = frozen
    runtime = await h.headers(tenant, "runtime", subject="rt")
    deps = h.context
    approval_id = (await decide(h, runtime, scripted(needs(("finance", 1)))))["approval"]["id"]
    with pytest.raises(ReviewRefused) as err:
        await approvals.review(deps, person(tenant, "rt", "finance", "admin"), approval_id,
                               decision="approved")
    assert err.value.code == "self_approval"
    with pytest.raises(NotFound):  # another tenant: the id does not exist for them
        await approvals.review(deps, person(f"{tenant}-x", "bob", "finance"), approval_id,
                               decision="approved")
    state = await approvals.review(deps, person(tenant, "bob", "finance"), approval_id,
                                   decision="approved", comment="checked the order")
    assert state["status"] == "approved"


@pytest.mark.parametrize("reviewers", [2, 8])
async def test_concurrent_reviews_completing_a_quorum_mint_one_permit(
        frozen: tuple[Harness, FrozenClock], tenant: str, reviewers: int) -> None:
    h, _ = frozen
    runtime = await h.headers(tenant, "runtime")
    deps = h.context
    approval_id = (await decide(h, runtime, scripted(needs(("finance", 2)))))["approval"]["id"]
    people = [person(tenant, f"p{i}", "finance") for i in range(reviewers)]
    outcomes = await asyncio.gather(*(
        approvals.review(deps, p, approval_id, decision="approved") for p in people),
        return_exceptions=True)
    accepted = [o for o in outcomes if isinstance(o, dict)]
    refused = [o for o in outcomes if not isinstance(o, dict)]
    assert len(accepted) == 2
    assert all(getattr(e, "code", None) in {"approval_not_pending", "role_already_met"}
               for e in refused), refused
    async with deps.db.read() as conn:
        minted = (await conn.execute(select(func.count()).select_from(permits).where(
            permits.c.approval_id == approval_id))).scalar_one()
    assert minted == 1


def test_a_later_stage_counts_only_for_reviews_given_once_it_would_have_opened() -> None:
    """The active chain asks a step-up first (60 s) and the old rules only after: reviews
    judged under the old rules meet it only when they came at least 60 s after the
    request opened (when the chain's second stage would have opened)."""
    loose = requirement(("finance", 1), distinct_from="initiator")
    chain = replace(loose, assurance="mfa", on_expired=loose)
    assert not quorum.reviews_still_meet(chain, ["finance"], loose, 0)
    assert not quorum.reviews_still_meet(chain, ["finance"], loose, 59_999)
    assert quorum.reviews_still_meet(chain, ["finance"], loose, 60_000)
    assert quorum.reviews_still_meet(chain, ["finance"], replace(loose, assurance="mfa"), 0)
