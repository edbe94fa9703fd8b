"""A superseded request names the request that replaced it (session 15).

A pending request that a decision of the same call may not join is superseded
(:mod:`cosigner.approvals.superseding`): cancelled, and a new request opens. The old
request records its replacement (``superseded_by``, migration 0028), so whoever still
holds the old id learns where the call went: its state (``GET /v1/approvals/{id}``, and
its long-poll, which ends as the request leaves ``pending``) carries ``superseded_by``,
and a runtime asking again for review of the same decision gets the request that now
holds the review (the end of the links: a replacement may be superseded in turn), with
its permit once approved, instead of the cancelled request it first opened; the approver
page of the old request links the new one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from alembic import command
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import create_async_engine

from cosigner.audit.chain import Event, append
from cosigner.core.clock import FrozenClock
from cosigner.db.migrate import alembic_config, upgrade
from cosigner.db.tables_approvals import approvals
from tests.conftest import Harness
from tests.db.test_migrate import empty_database  # noqa: F401 - fixture
from tests.http.approval_helpers import (
    decide,
    needs,
    redeem,
    review,
    scripted,
    scripted_harness,
    state,
)
from tests.http.raw_rows import chain_holds
from tests.web.conftest import add_user, sign_in, web_client

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


async def _ask_review(h: Harness, runtime: dict[str, str], decision_id: str) -> httpx.Response:
    return await h.client.post("/v1/approvals", headers=runtime, json={
        "decision_id": decision_id, "reason": "looks odd"})


async def test_asking_again_for_review_answers_the_request_that_replaced_the_first(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    h = await scripted_harness(harness_factory, tmp_path, clock=FrozenClock(T0))
    runtime = await h.headers(tenant, "runtime")
    fin = {s: await h.headers(tenant, "finance", subject=s) for s in ("carol", "dave", "erin")}
    body = scripted({"effect": "allow"}, run="run-review-again")
    allowed = await decide(h, runtime, body)
    first = await _ask_review(h, runtime, allowed["decision_id"])
    assert first.status_code == 200, first.text
    old = first.json()["id"]
    assert first.json()["kind"] == "runtime_review" and first.json().get("superseded_by") is None
    # The same call decided again, the policy now asking two finance approvers: the
    # review (finance x1) is superseded.
    second = await decide(h, runtime, {**body, "request_id": "stricter",
                                       "context": {"result": needs(("finance", 2))}})
    new = second["approval"]["id"]
    assert new != old
    again = await _ask_review(h, runtime, allowed["decision_id"])
    assert again.status_code == 200, again.text
    assert (again.json()["id"], again.json()["status"]) == (new, "pending")
    assert again.json().get("superseded_by") is None
    # The replacement superseded in turn: asking again follows both links.
    third = await decide(h, runtime, {**body, "request_id": "stricter-still",
                                      "context": {"result": needs(("finance", 3))}})
    newest = third["approval"]["id"]
    assert (await state(h, runtime, new)).get("superseded_by") == newest
    for subject in ("carol", "dave", "erin"):
        assert (await review(h, fin[subject], newest)).status_code == 200
    done = await _ask_review(h, runtime, allowed["decision_id"])
    assert done.status_code == 200, done.text
    answer = done.json()
    assert (answer["id"], answer["status"], answer["permit_status"]) == (
        newest, "approved", "issued")
    assert answer["permit"] is not None  # the runtime's answer carries it, as a read's does
    used = await redeem(h, runtime, answer["permit"]["token"], "delete_file",
                        body["args"])
    assert used.status_code == 200, used.text
    # The first request itself is unchanged: cancelled, naming its replacement.
    first_state = await state(h, runtime, old)
    assert (first_state["status"], first_state.get("superseded_by")) == ("cancelled", new)
    await chain_holds(h, tenant)


async def test_a_review_superseded_by_another_partys_request_stays_the_answer(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    """Another initiator's decision of the same call supersedes the review
    (``other_party``): that request is theirs (its approvers are compared with them), so
    asking again answers the cancelled review, naming it."""
    h = await scripted_harness(harness_factory, tmp_path)
    runtime = await h.headers(tenant, "runtime")
    body = scripted({"effect": "allow"}, run="run-review-party")
    allowed = await decide(h, runtime, body)
    old = (await _ask_review(h, runtime, allowed["decision_id"])).json()["id"]
    theirs = await decide(h, runtime, {
        **body, "request_id": "carol-proposes", "initiator": {"id": "carol", "type": "user"},
        "context": {"result": needs(("finance", 1))}})
    new = theirs["approval"]["id"]
    assert new != old
    again = await _ask_review(h, runtime, allowed["decision_id"])
    assert again.status_code == 200, again.text
    assert (again.json()["id"], again.json()["status"], again.json().get("superseded_by")) \
        == (old, "cancelled", new)


async def test_a_waiter_on_a_superseded_request_learns_its_replacement(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    """Through the long-poll (the edge's lean read) and a plain read (the stack), for a
    runtime and for an approver of the request."""
    h = await scripted_harness(harness_factory, tmp_path)
    runtime = await h.headers(tenant, "runtime")
    carol = await h.headers(tenant, "finance", subject="carol")
    body = scripted(needs(("finance", 1)), run="run-waiter")
    old = (await decide(h, runtime, body))["approval"]["id"]
    waiting = asyncio.create_task(h.client.get(f"/v1/approvals/{old}", headers=runtime,
                                               params={"wait": 20}))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    second = await decide(h, runtime, {**body, "request_id": "two-now",
                                       "context": {"result": needs(("finance", 2))}})
    new = second["approval"]["id"]
    waited = await asyncio.wait_for(waiting, timeout=15)
    assert waited.status_code == 200, waited.text
    assert (waited.json()["status"], waited.json().get("superseded_by")) == ("cancelled", new)
    read = await state(h, carol, old)
    assert (read["status"], read.get("superseded_by")) == ("cancelled", new)
    assert (await state(h, carol, new))["superseded_by"] is None
    # A request the runtime cancels itself names none.
    other = (await decide(h, runtime, scripted(needs(("finance", 1)))))["approval"]["id"]
    cancelled = await h.client.post(f"/v1/approvals/{other}/cancel", headers=runtime)
    assert cancelled.status_code == 200, cancelled.text
    assert (cancelled.json()["status"], cancelled.json().get("superseded_by")) == (
        "cancelled", None)


async def test_the_approver_page_of_a_superseded_request_links_its_replacement(
        harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> None:
    """An approver following a notification's link to the old request finds the new one."""
    h = await scripted_harness(harness_factory, tmp_path)
    runtime = await h.headers(tenant, "runtime")
    body = scripted(needs(("finance", 1)), run="run-page")
    old = (await decide(h, runtime, body))["approval"]["id"]
    await add_user(h.db, tenant, "fiona", "finance")
    async with web_client(h) as client:
        await sign_in(client, tenant, "fiona")
        before = (await client.get(f"/ui/approvals/{old}")).text
        assert 'id="superseded"' not in before
        new = (await decide(h, runtime, {**body, "request_id": "two-now", "context": {
            "result": needs(("finance", 2))}}))["approval"]["id"]
        page = await client.get(f"/ui/approvals/{old}")
        assert page.status_code == 200
        assert f'<a href="/ui/approvals/{new}" id="superseded-by">' in page.text
        assert 'id="superseded"' not in (await client.get(f"/ui/approvals/{new}")).text


def _to(connection: Any, url: str, revision: str, down: bool = False) -> None:
    cfg = alembic_config(url)
    cfg.attributes["connection"] = connection
    (command.downgrade if down else command.upgrade)(cfg, revision)


def _columns(connection: Any) -> list[str]:
    return [c["name"] for c in inspect(connection).get_columns("approvals")]


_OLD = "0a000000-0000-4000-8000-000000000001"
_NEW = "0a000000-0000-4000-8000-000000000002"
_OTHER = "0a000000-0000-4000-8000-000000000003"
_DECISION = "01a24289-09bd-71c2-8064-52c3fd4e8e87"


def _request(approval_id: str, status: str) -> dict[str, Any]:
    return {"id": approval_id, "tenant": "t-s15", "kind": "policy", "decision_id": _DECISION,
            "run_id": "run-1", "tool": "delete_file", "args_hash": "sha256:" + "0" * 64,
            "args": '{"path":"/tmp/a"}', "mask": [],
            "requirement": {"require": [{"role": "finance", "count": 1}],
                            "timeout_ms": 600000, "distinct_from": "initiator"},
            "status": status, "initiator": {"id": "agent", "type": "agent"},
            "principal": {"id": "p", "type": "user"}, "opened_by": {"subject": "rt"},
            "reasons": [], "policy": None, "reason": None,
            "created_at": T0, "expires_at": datetime(2030, 1, 1, 12, 10, tzinfo=UTC)}


async def test_0028_copies_the_link_from_the_log_and_downgrades(
        empty_database: str) -> None:  # noqa: F811
    """Requests superseded before 0028 get ``superseded_by`` from their
    ``approval.superseded`` event; a cancelled request without one keeps ``NULL``; the
    downgrade drops the column, and upgrading again copies the link again."""
    url = empty_database
    engine = create_async_engine(url)
    columns = [c for c in approvals.c if c.name != "superseded_by"]
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0027_s15_approvals_partial_ix")
            assert "superseded_by" not in await conn.run_sync(_columns)
            await conn.execute(approvals.insert(), [
                {c.name: row[c.name] for c in columns if c.name in row}
                for row in (_request(_OLD, "cancelled"), _request(_NEW, "pending"),
                            _request(_OTHER, "cancelled"))])
            await append(conn, "t-s15", [Event(
                type="approval.superseded", actor={"subject": "rt"},
                decision_id=_DECISION, approval_id=_OLD, run_id="run-1",
                tool="delete_file", args_hash="sha256:" + "0" * 64, policy=None,
                payload={"superseded_by": _NEW, "decision_id": _DECISION,
                         "reason": "requirement_raised", "voided": []})], now=T0)

        async def links() -> dict[str, Any]:
            async with engine.connect() as conn:
                found = (await conn.execute(text(
                    "SELECT id, superseded_by FROM approvals WHERE tenant = 't-s15'"))).all()
            return dict(found)

        await upgrade(url)
        assert await links() == {_OLD: _NEW, _NEW: None, _OTHER: None}
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0027_s15_approvals_partial_ix", True)
            assert "superseded_by" not in await conn.run_sync(_columns)
            # The partial unique index still holds: one pending request per call.
            names = {i["name"] for i in await conn.run_sync(
                lambda c: inspect(c).get_indexes("approvals"))}
            assert {"uq_approvals_pending_call", "ix_approvals_rejected_call"} <= names
        await upgrade(url)
        assert await links() == {_OLD: _NEW, _NEW: None, _OTHER: None}
    finally:
        await engine.dispose()
        await asyncio.sleep(0)
