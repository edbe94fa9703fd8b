"""Session 14 adversarial probes: stored form 8 of ``decisions.response`` (an allow answer
stored as its facts) and the pending-approval join that never weakens the current policy
(superseding). Each probe that found a defect fails before its fix; the others are kept
as regression tests."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import LargeBinary, bindparam, select, text

from cosigner.core.clock import FrozenClock
from cosigner.db import compressed
from cosigner.db.tables import audit_events, decisions
from tests.conftest import Harness
from tests.http.approval_helpers import (
    decide,
    needs,
    refund_args,
    review,
    scripted,
    scripted_harness,
    state,
)
from tests.http.raw_rows import chain_holds
from tests.http.test_approval_escalation import escalating

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def clocked(harness_factory: Callable[..., Any], tmp_path: Path
                  ) -> tuple[Harness, FrozenClock]:
    clock = FrozenClock(T0)
    return await scripted_harness(harness_factory, tmp_path, clock=clock), clock


def _claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    data: dict[str, Any] = json.loads(base64.urlsafe_b64decode(
        payload + "=" * (-len(payload) % 4)))
    return data


async def _stored_form(h: Harness, tenant: str, request_id: str) -> int:
    async with h.db.read() as conn:
        raw = (await conn.execute(select(decisions.c.response.cast(
            decisions.c.response.type.impl)).where(
            decisions.c.tenant == tenant, decisions.c.request_id == request_id))).scalar_one()
    return bytes(raw)[0]


# --- the join: escalation timing -----------------------------------------------------------


async def test_s14_join_at_stage_1_of_a_twin_that_escalates_sooner_lets_a_manager_in_early(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    """The twin: finance for 60 s, then a manager. The current policy: finance for 10 min,
    then a manager. A retry at 10 s finds the twin at its first stage and joins it (the
    first stages compare equal but for the twin's shorter timeout, which ``covers`` counts
    as stricter). At 61 s the twin escalates and a manager approves: a permit the current
    policy forbids until minute 10 (finance alone may approve before that). The escalated
    twin found by a retry *at* 61 s is superseded for exactly this reason
    (test_join_strictness ..._escalated_sooner_than_the_new_policy_is_superseded); joined
    a few seconds earlier it is not."""
    h, clock = clocked
    runtime = await h.headers(tenant, "runtime")
    manager = await h.headers(tenant, "manager", subject="mona")
    body = scripted(escalating(finance=1))  # finance 60 s -> manager 60 s
    old = (await decide(h, runtime, body))["approval"]["id"]
    clock.advance(seconds=10)
    longer = escalating(finance=1)
    longer["approval"]["timeout_ms"] = 600_000  # finance 10 min -> manager 60 s
    second = await decide(h, runtime, {**body, "request_id": "longer-first-stage",
                                       "context": {"result": longer}})
    clock.advance(seconds=51)  # 61 s after the twin opened; 51 s after the retry
    resp = await review(h, manager, second["approval"]["id"])
    # Under the current policy a manager cannot count before the finance stage's 10 min.
    assert not (resp.status_code == 200 and resp.json()["status"] == "approved"), (
        f"a manager approved at 61 s what the current policy keeps for finance until "
        f"10 min (joined {second['approval']['id'] == old})")


# --- the join: superseding races and tenants -----------------------------------------------


async def test_s14_a_review_racing_the_superseding_decision_is_consistent(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    """Two replicas: one approves the twin (completing its quorum) while the other decides
    the same call under a stricter policy. Either the approval wins (the twin approved,
    never superseded afterwards, the new decision opens its own request) or the supersede
    wins (the review refused ``approval_not_pending``, no permit for the twin)."""
    seen: set[int] = set()
    for attempt in range(6):
        replicas = [await scripted_harness(harness_factory, tmp_path / f"a{attempt}r{i}",
                                           log_batch_wait_ms=5) for i in range(2)]
        runtime = await replicas[0].headers(tenant, "runtime")
        carol = await replicas[1].headers(tenant, "finance", subject=f"carol{attempt}")
        body = scripted(needs(("finance", 1)), run=f"run-race-{attempt}")
        old = (await decide(replicas[0], runtime, body))["approval"]["id"]

        async def stricter(delay: float, attempt: int = attempt, body: Any = body,
                           h: Harness = replicas[0], runtime: Any = runtime
                           ) -> dict[str, Any]:
            await asyncio.sleep(delay)  # staggered, so that either side may win
            return await decide(h, runtime, {
                **body, "request_id": f"strict-{attempt}",
                "context": {"result": needs(("finance", 2))}})

        reviewed, second = await asyncio.gather(review(replicas[1], carol, old),
                                                stricter(0.004 * attempt))
        seen.add(reviewed.status_code)
        twin = await state(replicas[0], runtime, old)
        if reviewed.status_code == 200:
            assert twin["status"] == "approved" and twin["permit"] is not None
            assert second["approval"]["id"] != old
        else:
            assert reviewed.json()["code"] == "approval_not_pending", reviewed.text
            assert twin["status"] == "cancelled" and twin.get("permit") is None
        async with replicas[0].db.read() as conn:
            types = [t for (t,) in (await conn.execute(
                select(audit_events.c.type).where(
                    audit_events.c.tenant == tenant,
                    audit_events.c.approval_id == old))).all()]
        assert not ("approval.approved" in types and "approval.superseded" in types), types
        await chain_holds(replicas[0], tenant)
    assert seen == {200, 409}, seen  # both orders were exercised


async def test_s14_another_tenant_cannot_supersede_or_join(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    """Tenant B deciding the very same call (run, tool, args) under a stricter requirement
    opens its own request; tenant A's pending request and its reviews are untouched."""
    h, _ = clocked
    other = tenant + "-b"
    a_runtime, b_runtime = await h.headers(tenant, "runtime"), await h.headers(other,
                                                                                "runtime")
    carol = await h.headers(tenant, "finance", subject="carol")
    body = scripted(needs(("finance", 2)), run="run-shared")
    old = (await decide(h, a_runtime, body))["approval"]["id"]
    assert (await review(h, carol, old)).status_code == 200
    theirs = await decide(h, b_runtime, {**body, "request_id": body["request_id"],
                                         "context": {"result": needs(("finance", 3))}})
    assert theirs["approval"]["id"] != old
    mine = await state(h, a_runtime, old)
    assert mine["status"] == "pending"
    assert [(r["subject"], r["role"]) for r in mine["reviews"]] == [("carol", "finance")]
    resp = await h.client.get(f"/v1/approvals/{old}", headers=b_runtime)
    assert resp.status_code == 404
    # B's replay of A's request id is B's own answer.
    again = await decide(h, b_runtime, {**body, "context": {"result": needs(("finance", 3))}})
    assert again["decision_id"] == theirs["decision_id"]
    await chain_holds(h, tenant)
    await chain_holds(h, other)


async def test_s14_incomparable_requirements_churn_the_pending_request(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    """Same tenant, noted: two requirements neither of which covers the other (finance vs
    security) supersede each other at every retry, voiding the reviews given so far. A
    runtime whose context flips the policy between them keeps a request from ever
    completing. Kept as a record of the behaviour (it holds today)."""
    h, _ = clocked
    runtime = await h.headers(tenant, "runtime")
    carol = await h.headers(tenant, "finance", subject="carol")
    body = scripted(needs(("finance", 2)))
    ids = []
    for i, result in enumerate([needs(("finance", 2)), needs(("security", 1)),
                                needs(("finance", 2)), needs(("security", 1))]):
        ids.append((await decide(h, runtime, {**body, "request_id": f"flip-{i}",
                                              "context": {"result": result}}))["approval"]["id"])
        if i == 0:
            assert (await review(h, carol, ids[0])).status_code == 200
    assert len(set(ids)) == 4
    await chain_holds(h, tenant)


# --- form 8: replays byte for byte ---------------------------------------------------------


_ODD = [
    ({"effect": "allow", "reasons": ["ok"]}, "req-plain", "run-plain"),
    ({"effect": "allow", "reasons": ["é☃𝄞 \u2028 \"quoted\" </script>"]},
     "req-ü-𝄞", "run-é-☃"),
    ({"effect": "allow", "reasons": []}, "r" * 200, "run-" + "x" * 200),
    ({"effect": "allow", "reasons": ["x" * 70_000]}, "req-huge", "run-huge"),
    ({"effect": "allow", "reasons": [{"code": "c", "message": "m"}] * 40}, "req-many",
     "run-many"),
]


@pytest.mark.parametrize(("result", "request_id", "run_id"), _ODD,
                         ids=["plain", "unicode", "empty_long_ids", "huge", "many"])
async def test_s14_allow_replays_are_byte_identical(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str,
        result: dict[str, Any], request_id: str, run_id: str) -> None:
    h = await scripted_harness(harness_factory, tmp_path)
    runtime = await h.headers(tenant, "runtime")
    body = scripted(result, run=run_id, request_id=request_id)
    first = await h.client.post("/v1/decisions", headers=runtime, json=body)
    assert first.status_code == 200, first.text
    again = await h.client.post("/v1/decisions", headers=runtime, json=body)
    assert again.status_code == 200 and again.content == first.content
    assert first.json()["effect"] == "allow"


async def test_s14_replay_after_rotation_and_issuer_change_returns_the_first_token(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    """The key rotated and a second replica configured with another issuer and audience:
    a replay is the first answer, token and all (form 8 stores iss, aud and kid)."""
    h = await scripted_harness(harness_factory, tmp_path / "a")
    runtime = await h.headers(tenant, "runtime")
    bodies = [scripted({"effect": "allow", "reasons": ["ok"]}, run=f"run-rot-{i}")
              for i in range(3)]
    firsts = []
    for body in bodies:
        resp = await h.client.post("/v1/decisions", headers=runtime, json=body)
        assert resp.status_code == 200
        firsts.append(resp.content)
    assert await _stored_form(h, tenant, bodies[0]["request_id"]) == compressed.V8_FACTS
    await h.context.key_store.rotate(now=h.context.clock() + timedelta(seconds=1))
    other = await scripted_harness(harness_factory, tmp_path / "b", issuer="elsewhere",
                                   audience="other-executor")
    for replica in (h, other):
        for body, first in zip(bodies, firsts, strict=True):
            again = await replica.client.post("/v1/decisions", headers=runtime, json=body)
            assert again.status_code == 200 and again.content == first
    fresh = await other.client.post("/v1/decisions", headers=runtime, json=scripted(
        {"effect": "allow", "reasons": ["ok"]}, run="run-rot-new", request_id="rot-new"))
    claims = _claims(fresh.json()["permit"]["token"])
    assert (claims["iss"], claims["aud"]) == ("elsewhere", "other-executor")
    replay = await other.client.post("/v1/decisions", headers=runtime, json=scripted(
        {"effect": "allow", "reasons": ["ok"]}, run="run-rot-new", request_id="rot-new"))
    assert replay.content == fresh.content


@pytest.mark.parametrize("mode", ["shadow", "standing"])
async def test_s14_shadow_and_standing_allows_replay_exactly(
        clocked: tuple[Harness, FrozenClock], tenant: str, mode: str) -> None:
    h, _ = clocked
    runtime = await h.headers(tenant, "runtime")
    if mode == "shadow":
        body = scripted({"effect": "allow", "reasons": ["ok"]}, mode="shadow")
    else:
        carol = await h.headers(tenant, "finance", subject="carol")
        result = needs(("finance", 1))
        result["approval"]["standing"] = {"max_ttl_s": 3600, "max_uses": 5}
        first = scripted(result, run="run-standing", args=refund_args(150_000),
                         tool="issue_refund")
        opened = await decide(h, runtime, first)
        resp = await review(h, carol, opened["approval"]["id"], standing={
            "scope": "run", "constraints": [
                {"pointer": "/order_id", "op": "equals", "value": "ord_8472"}]})
        assert resp.status_code == 200, resp.text
        body = scripted(result, run="run-standing", request_id="standing-use",
                        args=refund_args(160_000), tool="issue_refund")
    resp = await h.client.post("/v1/decisions", headers=runtime, json=body)
    assert resp.status_code == 200, resp.text
    again = await h.client.post("/v1/decisions", headers=runtime, json=body)
    assert again.content == resp.content
    if mode == "standing":
        assert resp.json()["effect"] == "allow", resp.text
    assert await _stored_form(h, tenant, body["request_id"]) != compressed.V8_FACTS


# --- form 8: damaged rows ------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "text_length", "reasons", "trailing"])
async def test_s14_a_damaged_form_8_row_fails_closed_on_replay(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str,
        damage: str) -> None:
    """A replay of a request whose stored form 8 answer is damaged is refused (503, no
    internals), never a 500 and never an answer with other facts."""
    h = await scripted_harness(harness_factory, tmp_path)
    runtime = await h.headers(tenant, "runtime")
    body = scripted({"effect": "allow", "reasons": ["ok"]})
    first = await h.client.post("/v1/decisions", headers=runtime, json=body)
    assert first.status_code == 200
    raw_type = decisions.c.response.type.impl
    async with h.db.read() as conn:
        stored = bytes((await conn.execute(select(decisions.c.response.cast(raw_type)).where(
            decisions.c.tenant == tenant,
            decisions.c.request_id == body["request_id"]))).scalar_one())
    assert stored[0] == compressed.V8_FACTS
    at = 1  # the first text spelled out (the usual issuer and audience are a byte each)
    while stored[at] == 0xFF:
        at += 1
    bad = {"truncated": stored[:-3],
           "text_length": stored[:at] + bytes([stored[at] + 1]) + stored[at + 1:],
           "reasons": stored.replace(b'"ok"', b'"o\\'),
           "trailing": stored + b"\x00"}[damage]
    assert bad != stored
    async with h.db.transaction() as conn:
        await conn.execute(text(
            "UPDATE decisions SET response = :v WHERE tenant = :t AND request_id = :r"
        ).bindparams(bindparam("v", type_=LargeBinary())),
            {"v": bad, "t": tenant, "r": body["request_id"]})
    again = await h.client.post("/v1/decisions", headers=runtime, json=body)
    assert again.status_code in (409, 503), again.text
    assert again.content != first.content
    assert "Traceback" not in again.text and "ValueError" not in again.text


# --- superseding and the decision log: signed reviews, CLI verify --------------------------


def _counted_signed_bundle(folder: Path, tenant: str) -> Path:
    """``send_message`` needs ``context.n`` signed finance approvals."""
    bundle = folder / "bundles" / f"signed-n-{tenant}"
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "manifest.toml").write_text(
        f'id = "signed-n-{tenant}"\nversion = "1.0.0"\nengine = "python"\n'
        f'entrypoint = "decide"\ntenants = ["{tenant}"]\n')
    (bundle / "rules.py").write_text(
        "def decide(input):\n"
        "    return {'effect': 'require_approval', 'reasons': ['signed_review'],\n"
        "            'approval': {'signature': 'webauthn', 'require': [\n"
        "                {'role': 'finance', 'count': input['context']['n']}],\n"
        "                'distinct_from': 'initiator_and_previous'}}\n")
    return folder / "bundles"


async def test_s14_a_superseded_signed_review_still_verifies_and_the_new_request_needs_new_ones(
        harness_factory: Callable[..., Any], tenant: str, tmp_path: Path) -> None:
    """Fiona's signed approval of the twin is voided by the supersede; the export (twin's
    signed review, the supersede, three signed approvals of the new request) verifies
    offline, in process and through ``cosigner audit verify``."""
    import subprocess
    import sys

    from cosigner.approvals import reviews as review_module
    from cosigner.audit.verify import verify_export
    from tests.approvals.signed import PUBLIC_URL, Scene
    from tests.audit.conftest import export_lines, jwks
    from tests.conftest import decision_request

    h = await harness_factory(public_url=PUBLIC_URL,
                              bundle_dirs=[_counted_signed_bundle(tmp_path, tenant)])
    scene = await Scene(h, tenant).start()
    people = {n: await scene.person(n, "finance") for n in ("fiona", "gus", "hank")}
    keys = {n: await scene.register(c) for n, c in people.items()}
    body = decision_request(tool={"name": "send_message"}, args={"to": "c-42", "body": "x"},
                            context={"n": 2})
    old = (await decide(h, scene.runtime, body))["approval"]["id"]
    await review_module.review(h.context, people["fiona"], old, decision="approved",
                               assertion=await scene.sign(people["fiona"], keys["fiona"], old))
    new = (await decide(h, scene.runtime, {**body, "request_id": "signed-3",
                                           "context": {"n": 3}}))["approval"]["id"]
    assert new != old and (await scene.state(old))["status"] == "cancelled"
    for name in ("fiona", "gus", "hank"):
        await review_module.review(h.context, people[name], new, decision="approved",
                                   assertion=await scene.sign(people[name], keys[name], new))
    assert (await scene.state(new))["status"] == "approved"
    auditor = await h.headers(tenant, "auditor")
    lines = await export_lines(h, auditor)
    keyset = await jwks(h)
    report = verify_export(lambda: iter(lines), keyset)
    assert report.ok, report
    log, jwks_file = tmp_path / "log.jsonl", tmp_path / "jwks.json"
    log.write_text("".join(lines), newline="\n")
    jwks_file.write_text(json.dumps(keyset))
    cli = Path(sys.executable).with_name("cosigner")
    done = subprocess.run([str(cli), "audit", "verify", str(log), "--jwks", str(jwks_file)],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


async def test_s14_a_join_shows_approvers_args_the_current_policy_masks(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    """The current policy masks ``/path``; the retried call joined the twin opened before
    the mask, whose approver view showed ``/path`` in clear (invariant 10: a masked path
    never appears on the approver page). Defect found in review; fixed: a twin is joinable
    only when it hides at least what the current policy hides, else it is superseded."""
    h, _ = clocked
    runtime = await h.headers(tenant, "runtime")
    carol = await h.headers(tenant, "finance", subject="carol")
    body = scripted(needs(("finance", 1)), args={"path": "/secret/payroll.xlsx"})
    old = (await decide(h, runtime, body))["approval"]["id"]
    masked = {**needs(("finance", 1)), "mask": ["/path"]}
    second = await decide(h, runtime, {**body, "request_id": "now-masked",
                                       "context": {"result": masked}})
    shown = await h.client.get(f"/v1/approvals/{second['approval']['id']}", headers=carol)
    assert shown.status_code == 200, shown.text
    assert "/secret/payroll.xlsx" not in shown.text, (
        f"joined={second['approval']['id'] == old}: the approver sees the masked path")
    assert second["approval"]["id"] != old  # superseded, not joined
    again = await decide(h, runtime, {**body, "request_id": "masked-again",
                                      "context": {"result": masked}})
    assert again["approval"]["id"] == second["approval"]["id"]  # same mask: joins


# --- migration 0026 on real rows ------------------------------------------------------------


async def test_s14_0026_down_and_up_on_real_rows_keeps_every_replay(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str,
        db_kind: str) -> None:
    """Real answers of every kind (allow, deny, require_approval, shadow, a standing
    approval's allow): migration 0026 down then up again, each replay byte-identical to the
    first answer. SQLite only (the PostgreSQL database is shared by the session)."""
    if db_kind != "sqlite":
        pytest.skip("rewrites every row of the database")
    from sqlalchemy.ext.asyncio import create_async_engine

    from cosigner.db.migrate import upgrade
    from tests.db.test_answer_facts import _to

    clock = FrozenClock(T0)
    h = await scripted_harness(harness_factory, tmp_path, clock=clock)
    runtime = await h.headers(tenant, "runtime")
    carol = await h.headers(tenant, "finance", subject="carol")
    standing = needs(("finance", 1))
    standing["approval"]["standing"] = {"max_ttl_s": 3600, "max_uses": 5}
    opened = await decide(h, runtime, scripted(standing, run="run-m", args=refund_args(1),
                                               tool="issue_refund"))
    assert (await review(h, carol, opened["approval"]["id"], standing={
        "scope": "run", "constraints": [
            {"pointer": "/order_id", "op": "equals", "value": "ord_8472"}]})).status_code == 200
    bodies = [
        scripted({"effect": "allow", "reasons": ["ok"]}, run="run-m"),
        scripted({"effect": "allow", "reasons": ["é𝄞"]}, run="run-ü", request_id="req-ü"),
        scripted({"effect": "deny", "reasons": ["no"]}, run="run-m"),
        scripted(needs(("finance", 2)), run="run-m", args={"path": "/b"}),
        scripted({"effect": "allow", "reasons": ["ok"]}, run="run-m", mode="shadow"),
        scripted(standing, run="run-m", args=refund_args(2), tool="issue_refund"),
    ]
    firsts = []
    for body in bodies:
        resp = await h.client.post("/v1/decisions", headers=runtime, json=body)
        assert resp.status_code == 200, resp.text
        firsts.append(resp.content)
    assert json.loads(firsts[-1])["effect"] == "allow"

    async def replays() -> None:
        for body, first in zip(bodies, firsts, strict=True):
            again = await h.client.post("/v1/decisions", headers=runtime, json=body)
            assert again.status_code == 200 and again.content == first, again.text

    url = h.settings.database_url
    engine = create_async_engine(url)
    try:
        await replays()
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0025_s13_permit_token_digest", True)
            # Down to 0025 also undid 0028 (approvals.superseded_by), which the code at
            # head reads: put the column back for the replays on 0025's rows (this test
            # is about 0026's rewrite), and take it out again before the upgrade.
            await conn.execute(text("ALTER TABLE approvals ADD COLUMN superseded_by "
                                    "VARCHAR(36)"))
        assert await _stored_form(h, tenant, bodies[0]["request_id"]) == 7
        await replays()
        async with engine.begin() as conn:
            await conn.execute(text("ALTER TABLE approvals DROP COLUMN superseded_by"))
        await upgrade(url)
        assert await _stored_form(h, tenant, bodies[0]["request_id"]) == 8
        assert await _stored_form(h, tenant, "req-ü") == 8
        await replays()
    finally:
        await engine.dispose()
