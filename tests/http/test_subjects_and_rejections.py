"""One identity per person (case K29) and rejections that stick (issue 13, faults 3 and 5),
against a live ``cosigner serve``."""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from cosigner.cli.main import main
from cosigner.core.clock import system_clock
from cosigner.core.errors import InvalidRequest, SubjectConflict
from cosigner.core.subjects import canonical_subject
from cosigner.db.database import Database
from cosigner.db.tables import audit_events, principals
from cosigner.identity import accounts
from cosigner.identity.principals import create_api_key
from tests.conftest import start_module_server
from tests.http.approval_helpers import needs, scripted, write_scripted_bundle
from tests.web.conftest import PASSWORD


@pytest.fixture(scope="module")
def live(db_kind: str, pg_url: str | None, sqlite_template: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``(url, database_url)`` of one live server with the scripted bundle."""
    folder = tmp_path_factory.mktemp("subjects-live")
    server, database_url = start_module_server(
        folder, db_kind=db_kind, pg_url=pg_url, sqlite_template=sqlite_template,
        bundle_dirs=[write_scripted_bundle(folder / "bundles")])
    yield server.url, database_url
    server.stop()


async def _key(database_url: str, tenant: str, subject: str, *roles: str) -> dict[str, str]:
    db = Database(database_url)
    try:
        key, _ = await create_api_key(db, tenant=tenant, roles=list(roles), subject=subject,
                                      clock=system_clock)
    finally:
        await db.dispose()
    return {"Authorization": f"Bearer {key}"}


async def _post(url: str, path: str, headers: dict[str, str], body: dict[str, Any]
                ) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return await client.post(path, headers=headers, json=body)


async def _decide(url: str, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    resp = await _post(url, "/v1/decisions", headers, body)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def _again(body: dict[str, Any]) -> dict[str, Any]:
    """The same call (run, tool, args) as a new decision request."""
    return {**body, "request_id": f"req-{uuid.uuid4().hex}"}


async def _events(database_url: str, tenant: str, event_type: str) -> list[dict[str, Any]]:
    db = Database(database_url)
    try:
        async with db.read() as conn:
            rows = (await conn.execute(select(audit_events.c.body).where(
                audit_events.c.tenant == tenant, audit_events.c.type == event_type))).all()
    finally:
        await db.dispose()
    return [json.loads(row.body) for row in rows]


# --- one identity per person (K29) --------------------------------------------------------


@pytest.mark.parametrize("value", ["Alice@Corp.Example", "ALICE@corp.example",
                                   "\uff41lice@corp.example", "alice@corp.example"])
def test_k29_spellings_of_one_person_have_one_canonical_form(value: str) -> None:
    assert canonical_subject(value) == "alice@corp.example"


@pytest.mark.parametrize("value", ["", "   ", " alice", "alice ", "al\u200bice", "al\x00ice",
                                   "al\u202eice", "alice\n"])
def test_k29_unusable_subjects_are_refused(value: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        canonical_subject(value)
    assert caught.value.code == "invalid_subject"


async def test_k29_a_second_spelling_is_refused_at_key_creation(
        live: tuple[str, str], tenant: str) -> None:
    _, database_url = live
    await _key(database_url, tenant, "alice@corp.example", "finance")
    for spelling in ("Alice@Corp.Example", "ALICE@corp.example", "\uff41lice@corp.example"):
        with pytest.raises(SubjectConflict) as caught:
            await _key(database_url, tenant, spelling, "finance")
        assert caught.value.code == "subject_conflict"
    await _key(database_url, tenant, "alice@corp.example", "security")  # same spelling: ok
    db = Database(database_url)
    try:
        async with db.read() as conn:
            rows = (await conn.execute(select(principals.c.subject, principals.c.roles).where(
                principals.c.tenant == tenant))).all()
    finally:
        await db.dispose()
    assert [(r.subject, sorted(r.roles)) for r in rows] == [
        ("alice@corp.example", ["finance", "security"])]


def test_k29_cli_refuses_a_second_spelling_of_a_key_or_user(
        live: tuple[str, str], tenant: str, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, database_url = live
    monkeypatch.setenv("COSIGNER_DATABASE_URL", database_url)
    monkeypatch.setenv("COSIGNER_KEY_DIR", str(tmp_path / "keys"))
    assert main(["principals", "add-key", "--tenant", tenant, "--role", "finance",
                 "--subject", "alice@corp.example"]) == 0
    assert main(["principals", "add-key", "--tenant", tenant, "--role", "finance",
                 "--subject", "Alice@Corp.Example"]) == 1
    assert "subject_conflict" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    assert main(["principals", "add-user", "ALICE@corp.example", "--tenant", tenant,
                 "--role", "finance", "--password-stdin"]) == 1
    assert "subject_conflict" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    assert main(["principals", "add-user", "Bob@Corp.Example", "--tenant", tenant,
                 "--role", "finance", "--password-stdin"]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    assert main(["principals", "add-user", " bob@corp.example", "--tenant", tenant,
                 "--role", "finance", "--password-stdin"]) == 1
    assert "invalid_subject" in capsys.readouterr().err

    async def sign_in(name: str) -> str:
        db = Database(database_url)
        try:
            caller = await accounts.authenticate_password(
                db, tenant=tenant, name=name, password=PASSWORD, address="198.51.100.9",
                clock=system_clock)
        finally:
            await db.dispose()
        return caller.subject

    # One account however it is typed at sign-in; its subject is the canonical form.
    assert asyncio.run(sign_in("bob@corp.example")) == "bob@corp.example"
    assert asyncio.run(sign_in("BOB@CORP.EXAMPLE")) == "bob@corp.example"


async def test_k29_two_spellings_never_meet_a_two_person_quorum(
        live: tuple[str, str], tenant: str) -> None:
    url, database_url = live
    runtime = await _key(database_url, tenant, "orchestrator", "runtime")
    alice = await _key(database_url, tenant, "alice@corp.example", "finance")
    alice_again = await _key(database_url, tenant, "alice@corp.example", "finance")
    with pytest.raises(SubjectConflict):
        await _key(database_url, tenant, "Alice@Corp.Example", "finance")
    decision = await _decide(url, runtime, scripted(needs(("finance", 2))))
    approval_id = decision["approval"]["id"]
    first = await _post(url, f"/v1/approvals/{approval_id}/reviews", alice,
                        {"decision": "approved", "comment": "ok"})
    assert first.status_code == 200, first.text
    second = await _post(url, f"/v1/approvals/{approval_id}/reviews", alice_again,
                         {"decision": "approved", "comment": "ok"})
    assert (second.status_code, second.json()["code"]) == (409, "duplicate_review")
    bob = await _key(database_url, tenant, "Bob@Corp.Example", "finance")
    done = await _post(url, f"/v1/approvals/{approval_id}/reviews", bob,
                       {"decision": "approved", "comment": "ok"})
    assert done.status_code == 200 and done.json()["status"] == "approved"
    # The permit's approvers are canonical subjects, one per person.
    assert sorted(r["subject"] for r in done.json()["reviews"]) == [
        "alice@corp.example", "bob@corp.example"]


async def test_k29_reviews_compare_the_initiator_in_canonical_form(
        live: tuple[str, str], tenant: str) -> None:
    url, database_url = live
    runtime = await _key(database_url, tenant, "orchestrator", "runtime")
    alice = await _key(database_url, tenant, "alice@corp.example", "finance")
    body = scripted(needs(("finance", 1)),
                    initiator={"id": "ALICE@Corp.Example", "type": "user"})
    decision = await _decide(url, runtime, body)
    refused = await _post(url, f"/v1/approvals/{decision['approval']['id']}/reviews", alice,
                          {"decision": "approved", "comment": "mine"})
    assert (refused.status_code, refused.json()["code"]) == (403, "self_approval")


# --- rejections stick ---------------------------------------------------------------------


async def test_a_rejected_policy_approval_sticks_in_its_run(
        live: tuple[str, str], tenant: str) -> None:
    url, database_url = live
    runtime = await _key(database_url, tenant, "orchestrator", "runtime")
    finance = await _key(database_url, tenant, "fiona", "finance")
    body = scripted(needs(("finance", 1)))
    first = await _decide(url, runtime, body)
    approval_id = first["approval"]["id"]
    rejected = await _post(url, f"/v1/approvals/{approval_id}/reviews", finance,
                           {"decision": "rejected", "comment": "not this refund"})
    assert rejected.status_code == 200 and rejected.json()["status"] == "rejected"

    again = await _decide(url, runtime, _again(body))
    assert again["effect"] == "deny" and again["approval"] is None
    assert again["permit"] is None
    assert again["reasons"][0]["code"] == "rejected_by_reviewer"
    assert approval_id in again["reasons"][0]["message"]
    assert "not this refund" in again["reasons"][0]["message"]
    # The policy cannot override it, and no new request was opened silently.
    allowed = await _decide(url, runtime, _again({**body, "context": {
        "result": {"effect": "allow"}}}))
    assert allowed["effect"] == "deny"
    assert allowed["reasons"][0]["code"] == "rejected_by_reviewer"
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        pending = (await client.get("/v1/approvals", headers=runtime)).json()["items"]
    assert pending == []
    # Another run, or other arguments, is another call.
    other_run = await _decide(url, runtime, scripted(needs(("finance", 1))))
    assert other_run["effect"] == "require_approval"
    other_args = await _decide(url, runtime, _again({**body, "args": {"path": "/tmp/b"}}))
    assert other_args["effect"] == "require_approval"


async def test_a_rejected_runtime_review_sticks_until_withdrawn(
        live: tuple[str, str], tenant: str) -> None:
    url, database_url = live
    runtime = await _key(database_url, tenant, "orchestrator", "runtime")
    finance = await _key(database_url, tenant, "fiona", "finance")
    other_finance = await _key(database_url, tenant, "gustav", "finance")
    admin = await _key(database_url, tenant, "root", "admin")
    body = scripted({"effect": "allow"})
    first = await _decide(url, runtime, body)
    assert first["effect"] == "allow"
    asked = await _post(url, "/v1/approvals", runtime,
                        {"decision_id": first["decision_id"], "reason": "looks odd"})
    assert asked.status_code == 200, asked.text
    approval_id = asked.json()["id"]
    rejected = await _post(url, f"/v1/approvals/{approval_id}/reviews", finance,
                           {"decision": "rejected", "comment": "wrong customer"})
    assert rejected.json()["status"] == "rejected"

    # The same call in the same run: the policy allows it, the rejection wins. Several at
    # once, so the group-commit batch confirms the prepared allows together.
    answers = await asyncio.gather(*[_decide(url, runtime, _again(body)) for _ in range(5)])
    for again in answers:
        assert again["effect"] == "deny" and again["permit"] is None
        assert again["reasons"][0]["code"] == "rejected_by_reviewer"
        assert "wrong customer" in again["reasons"][0]["message"]

    path = f"/v1/approvals/{approval_id}/withdraw-rejection"
    refused = await _post(url, path, runtime, {"reason": "please"})
    assert (refused.status_code, refused.json()["code"]) == (403, "not_eligible")
    blank = await _post(url, path, other_finance, {"reason": ""})
    assert blank.status_code == 422
    withdrawn = await _post(url, path, other_finance, {"reason": "customer confirmed"})
    assert withdrawn.status_code == 200, withdrawn.text
    assert withdrawn.json()["rejection_withdrawn_at"] is not None
    twice = await _post(url, path, admin, {"reason": "again"})
    assert (twice.status_code, twice.json()["code"]) == (409, "rejection_withdrawn")

    after = await _decide(url, runtime, _again(body))
    assert after["effect"] == "allow" and after["permit"] is not None
    logged = await _events(database_url, tenant, "approval.rejection_withdrawn")
    assert [(e["actor"]["subject"], e["payload"]["reason"]) for e in logged] == [
        ("gustav", "customer confirmed")]
    refusals = await _events(database_url, tenant, "approval.withdraw_refused")
    assert sorted(e["payload"]["code"] for e in refusals) == [
        "not_eligible", "rejection_withdrawn"]


async def test_an_admin_may_withdraw_but_never_the_requesting_side(
        live: tuple[str, str], tenant: str) -> None:
    url, database_url = live
    runtime = await _key(database_url, tenant, "orchestrator", "runtime", "finance")
    finance = await _key(database_url, tenant, "fiona", "finance")
    admin = await _key(database_url, tenant, "root", "admin")
    body = scripted(needs(("finance", 1)))
    approval_id = (await _decide(url, runtime, body))["approval"]["id"]
    await _post(url, f"/v1/approvals/{approval_id}/reviews", finance,
                {"decision": "rejected", "comment": "no"})
    path = f"/v1/approvals/{approval_id}/withdraw-rejection"
    own = await _post(url, path, runtime, {"reason": "let me"})
    assert (own.status_code, own.json()["code"]) == (403, "self_approval")
    assert (await _post(url, path, admin, {"reason": "reviewed"})).status_code == 200
    again = await _decide(url, runtime, _again(body))
    assert again["effect"] == "require_approval"
    assert again["approval"]["id"] != approval_id


async def test_a_rejection_revokes_a_permit_minted_for_the_same_call_before_it(
        live: tuple[str, str], tenant: str) -> None:
    """A sibling ``allow`` of the same call (or one racing the rejection) got a permit
    before the reviewer rejected the call: redeeming it afterwards is refused (the
    rejection sticks at the time of use too) and the permit is revoked."""
    url, database_url = live
    runtime = await _key(database_url, tenant, "orchestrator", "runtime")
    finance = await _key(database_url, tenant, "fiona", "finance")
    body = scripted({"effect": "allow"})
    first = await _decide(url, runtime, body)
    sibling = await _decide(url, runtime, _again(body))
    assert first["effect"] == sibling["effect"] == "allow" and sibling["permit"] is not None
    asked = await _post(url, "/v1/approvals", runtime,
                        {"decision_id": first["decision_id"], "reason": "looks odd"})
    approval_id = asked.json()["id"]
    rejected = await _post(url, f"/v1/approvals/{approval_id}/reviews", finance,
                           {"decision": "rejected", "comment": "wrong customer"})
    assert rejected.json()["status"] == "rejected"

    redeem = {"permit": sibling["permit"]["token"], "tool": body["tool"]["name"],
              "args": body["args"]}
    refused = await _post(url, "/v1/permits/redeem", runtime, redeem)
    assert (refused.status_code, refused.json()["code"]) == (409, "revoked"), refused.text
    assert approval_id in refused.json()["detail"]
    again = await _post(url, "/v1/permits/redeem", runtime, redeem)
    assert (again.status_code, again.json()["code"]) == (409, "revoked")
    revoked = await _events(database_url, tenant, "permit.revoked")
    assert [e["payload"]["reason"] for e in revoked
            if e["payload"].get("rejected_approval_id") == approval_id] == [
        "rejected_by_reviewer"]

    # Another run's permit for the same tool and arguments is another call: it redeems.
    other = await _decide(url, runtime, scripted({"effect": "allow"}))
    ok = await _post(url, "/v1/permits/redeem", runtime, {
        "permit": other["permit"]["token"], "tool": "delete_file", "args": {"path": "/tmp/a"}})
    assert ok.status_code == 200, ok.text


async def test_a_permit_minted_before_a_withdrawn_rejection_redeems_once(
        live: tuple[str, str], tenant: str) -> None:
    """A rejection withdrawn before the redeem no longer stands: the permit minted for the
    same call before it redeems (SQLite: the redeem UPDATE's own NOT EXISTS), once."""
    url, database_url = live
    runtime = await _key(database_url, tenant, "orchestrator", "runtime")
    finance = await _key(database_url, tenant, "fiona", "finance")
    other_finance = await _key(database_url, tenant, "gustav", "finance")
    body = scripted({"effect": "allow"})
    first = await _decide(url, runtime, body)
    sibling = await _decide(url, runtime, _again(body))
    assert sibling["permit"] is not None
    asked = await _post(url, "/v1/approvals", runtime,
                        {"decision_id": first["decision_id"], "reason": "looks odd"})
    approval_id = asked.json()["id"]
    await _post(url, f"/v1/approvals/{approval_id}/reviews", finance,
                {"decision": "rejected", "comment": "wrong customer"})
    withdrawn = await _post(url, f"/v1/approvals/{approval_id}/withdraw-rejection",
                            other_finance, {"reason": "customer confirmed"})
    assert withdrawn.status_code == 200, withdrawn.text
    redeem = {"permit": sibling["permit"]["token"], "tool": body["tool"]["name"],
              "args": body["args"]}
    answers = await asyncio.gather(*[_post(url, "/v1/permits/redeem", runtime, redeem)
                                     for _ in range(4)])
    outcomes = sorted((a.status_code, a.json().get("code", a.json().get("status")))
                      for a in answers)
    assert outcomes == [(200, "redeemed")] + [(409, "already_redeemed")] * 3, outcomes
    revoked = await _events(database_url, tenant, "permit.revoked")
    assert [e["payload"]["reason"] for e in revoked] == ["review_requested"]  # first's
