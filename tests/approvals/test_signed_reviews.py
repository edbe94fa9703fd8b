"""Signed reviews (issue 22): an approval counts for a ``signature: "webauthn"`` group only
with the approver's own passkey assertion over the review statement. Runs on SQLite and
PostgreSQL with a software authenticator (the browser path is tests/web/test_passkeys.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from cosigner.approvals import reviews
from cosigner.audit.verify import verify_export
from cosigner.core.errors import ReviewRefused
from cosigner.core.review_statements import from_b64url, review_statement, statement_digest
from cosigner.identity import passkeys
from tests.approvals.signed import PUBLIC_URL, Scene, signed_bundle
from tests.audit.conftest import export_lines, jwks
from tests.conftest import Harness


@pytest.fixture
async def scene(harness_factory: Any, tenant: str, tmp_path: Path) -> Scene:
    bundles = signed_bundle(tmp_path, tenant, require="[{'role': 'finance', 'count': 2}]")
    h = await harness_factory(public_url=PUBLIC_URL, bundle_dirs=[bundles])
    return await Scene(h, tenant).start()


async def refused(scene: Scene, caller: Any, approval_id: str, **kw: Any) -> str:
    with pytest.raises(ReviewRefused) as info:
        await reviews.review(scene.h.context, caller, approval_id, **kw)
    return info.value.code


def claims_of(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


async def test_two_signed_approvals_mint_a_permit_carrying_each_signature(scene: Scene) -> None:
    fiona, gus = await scene.person("fiona", "finance"), await scene.person("gus", "finance")
    fiona_key, gus_key = await scene.register(fiona), await scene.register(gus)
    approval_id = await scene.decide()
    for caller, key in ((fiona, fiona_key), (gus, gus_key)):
        assertion = await scene.sign(caller, key, approval_id)
        await reviews.review(scene.h.context, caller, approval_id, decision="approved",
                             assertion=assertion)
    state = await scene.state(approval_id)
    assert state["status"] == "approved"
    assert [r["signed"] for r in state["reviews"]] == [True, True]
    claims = claims_of(state["permit"]["token"])
    refs = {a["id"]: a["signature"] for a in claims["approvers"]}
    assert refs["fiona"]["credential_id"] == fiona_key.id
    statement = review_statement(
        tenant=scene.tenant, approval_id=approval_id, tool="send_message",
        args_hash=claims["args_hash"], decision="approved", policy=claims["policy"],
        reviewer="fiona", time=refs["fiona"]["time"])
    assert from_b64url(refs["fiona"]["statement_digest"]) == statement_digest(statement)
    auditor = await scene.h.headers(scene.tenant, "auditor")
    lines = await export_lines(scene.h, auditor)
    report = verify_export(lambda: iter(lines), await jwks(scene.h))
    assert report.ok, report


async def test_unsigned_review_by_a_person_is_refused_and_logged(scene: Scene) -> None:
    fiona = await scene.person("fiona", "finance")
    await scene.register(fiona)
    approval_id = await scene.decide()
    code = await refused(scene, fiona, approval_id, decision="approved")
    assert code == "signature_required"
    auditor = await scene.h.headers(scene.tenant, "auditor")
    events = [json.loads(line) for line in await export_lines(scene.h, auditor)]
    refusals = [e["body"] for e in events if e.get("kind") == "event"
                and e["body"]["type"] == "approval.review_refused"]
    assert refusals[-1]["payload"]["code"] == "signature_required"


async def test_api_key_review_of_a_signed_requirement_is_refused(scene: Scene) -> None:
    approval_id = await scene.decide()
    approver = await scene.h.headers(scene.tenant, "finance", subject="bot-approver")
    resp = await scene.h.client.post(f"/v1/approvals/{approval_id}/reviews",
                                     headers=approver, json={"decision": "approved"})
    assert resp.status_code == 409 and resp.json()["code"] == "signature_required", resp.text
    assert (await scene.state(approval_id))["progress"][0]["approved"] == 0


async def test_assertion_for_another_approval_is_refused(scene: Scene) -> None:
    fiona = await scene.person("fiona", "finance")
    key = await scene.register(fiona)
    first, second = await scene.decide(), await scene.decide()
    assertion = await scene.sign(fiona, key, second)
    code = await refused(scene, fiona, first, decision="approved", assertion=assertion)
    assert code == "signature_challenge_mismatch"


async def test_assertion_for_another_decision_is_refused(scene: Scene) -> None:
    fiona = await scene.person("fiona", "finance")
    key = await scene.register(fiona)
    approval_id = await scene.decide()
    assertion = await scene.sign(fiona, key, approval_id, decision="rejected")
    code = await refused(scene, fiona, approval_id, decision="approved", assertion=assertion)
    assert code == "signature_challenge_mismatch"  # the statement recomputed says "approve"


async def test_replayed_assertion_is_refused(scene: Scene) -> None:
    fiona = await scene.person("fiona", "finance")
    key = await scene.register(fiona)
    approval_id = await scene.decide()
    assertion = await scene.sign(fiona, key, approval_id)
    await reviews.review(scene.h.context, fiona, approval_id, decision="approved",
                         assertion=assertion)
    code = await refused(scene, fiona, approval_id, decision="approved", assertion=assertion)
    assert code == "signature_replayed"


async def test_missing_user_verification_is_refused(scene: Scene) -> None:
    fiona = await scene.person("fiona", "finance")
    key = await scene.register(fiona)
    approval_id = await scene.decide()
    assertion = await scene.sign(fiona, key, approval_id, uv=False)
    code = await refused(scene, fiona, approval_id, decision="approved", assertion=assertion)
    assert code == "signature_invalid"


async def test_other_origin_is_refused(scene: Scene) -> None:
    fiona = await scene.person("fiona", "finance")
    key = await scene.register(fiona)
    approval_id = await scene.decide()
    assertion = await scene.sign(fiona, key, approval_id, origin="https://evil.example")
    code = await refused(scene, fiona, approval_id, decision="approved", assertion=assertion)
    assert code == "signature_invalid"


async def test_removed_and_foreign_credentials_are_refused(scene: Scene) -> None:
    fiona, gus = await scene.person("fiona", "finance"), await scene.person("gus", "finance")
    fiona_key = await scene.register(fiona)
    await scene.register(gus)
    approval_id = await scene.decide()
    assertion = await scene.sign(fiona, fiona_key, approval_id)
    # gus submits fiona's signature as his own: the credential is not his.
    code = await refused(scene, gus, approval_id, decision="approved", assertion=assertion)
    assert code == "unknown_credential"
    ctx = scene.h.context
    await passkeys.remove_credential(ctx.db, ctx.clock, fiona, fiona_key.id)
    code = await refused(scene, fiona, approval_id, decision="approved", assertion=assertion)
    assert code == "credential_removed"


async def test_one_person_counts_once_however_many_passkeys(scene: Scene) -> None:
    fiona = await scene.person("fiona", "finance")
    first, second = await scene.register(fiona), await scene.register(fiona)
    approval_id = await scene.decide()
    await reviews.review(scene.h.context, fiona, approval_id, decision="approved",
                         assertion=await scene.sign(fiona, first, approval_id))
    code = await refused(scene, fiona, approval_id, decision="approved",
                         assertion=await scene.sign(fiona, second, approval_id))
    assert code == "duplicate_review"
    assert (await scene.state(approval_id))["progress"][0]["approved"] == 1


async def test_admin_removes_a_passkey_and_the_key_export_keeps_it(scene: Scene) -> None:
    fiona = await scene.person("fiona", "finance")
    key = await scene.register(fiona)
    admin = await scene.h.headers(scene.tenant, "admin")
    listed = await scene.h.client.get("/v1/approvers/credentials", headers=admin)
    assert [c["credential_id"] for c in listed.json()["items"]] == [key.id]
    gone = await scene.h.client.delete(f"/v1/approvers/credentials/{key.id}", headers=admin)
    assert gone.status_code == 200 and gone.json()["removed_at"], gone.text
    again = await scene.h.client.delete(f"/v1/approvers/credentials/{key.id}", headers=admin)
    assert again.status_code == 404
    exported = (await scene.h.client.get("/v1/approvers/keys", headers=scene.runtime)).json()
    assert exported["rp_id"] == "localhost" and exported["origin"] == PUBLIC_URL
    assert [(k["kid"], k["sub"], k["kty"], k["alg"]) for k in exported["keys"]] == [
        (key.id, "fiona", "EC", "ES256")]
    assert exported["keys"][0]["removed_at"]
    other = await scene.h.headers("other-" + scene.tenant, "runtime")
    assert (await scene.h.client.get("/v1/approvers/keys", headers=other)).json()["keys"] == []
    runtime_delete = await scene.h.client.delete(f"/v1/approvers/credentials/{key.id}",
                                                 headers=scene.runtime)
    assert runtime_delete.status_code == 403


async def test_per_group_signature(harness_factory: Any, tenant: str, tmp_path: Path) -> None:
    bundles = signed_bundle(tmp_path, tenant, whole=False, require=(
        "[{'role': 'finance', 'count': 1}, "
        "{'role': 'security', 'count': 1, 'signature': 'webauthn'}]"))
    h: Harness = await harness_factory(public_url=PUBLIC_URL, bundle_dirs=[bundles])
    scene = await Scene(h, tenant).start()
    fiona, sam = await scene.person("fiona", "finance"), await scene.person("sam", "security")
    approval_id = await scene.decide()
    await reviews.review(h.context, fiona, approval_id, decision="approved")  # unsigned: ok
    assert await refused(scene, sam, approval_id, decision="approved") == "signature_required"
    key = await scene.register(sam)
    await reviews.review(h.context, sam, approval_id, decision="approved",
                         assertion=await scene.sign(sam, key, approval_id))
    state = await scene.state(approval_id)
    assert state["status"] == "approved"
    approvers = {a["id"]: a for a in claims_of(state["permit"]["token"])["approvers"]}
    assert "signature" not in approvers["fiona"] and "signature" in approvers["sam"]


async def test_a_slack_click_never_signs_even_with_an_assertion(scene: Scene) -> None:
    from dataclasses import replace

    from cosigner.identity.principals import Authn

    fiona = await scene.person("fiona", "finance")
    key = await scene.register(fiona)
    approval_id = await scene.decide()
    assertion = await scene.sign(fiona, key, approval_id)
    slack = replace(fiona, authn=Authn("slack"))
    code = await refused(scene, slack, approval_id, decision="approved", assertion=assertion)
    assert code == "signature_required"
    # The assertion was not used up by the refusal: fiona's own session still counts it.
    await reviews.review(scene.h.context, fiona, approval_id, decision="approved",
                         assertion=assertion)


async def test_a_passkey_removed_while_its_review_is_checked_does_not_count(
        scene: Scene, db_kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The removal commits between the review reading the credential and using it: the
    review must not count (else the log shows a review by a key removed before it, which
    ``cosigner audit verify`` rightly reports as ``unknown_credential``)."""
    if db_kind != "postgres":
        pytest.skip("SQLite runs one writer at a time: no interleaving to test")
    from cosigner.approvals import signatures

    fiona = await scene.person("fiona", "finance")
    key = await scene.register(fiona)
    approval_id = await scene.decide()
    assertion = await scene.sign(fiona, key, approval_id)
    checked = signatures.check_assertion
    ctx = scene.h.context

    async def remove_now() -> None:
        await passkeys.remove_credential(ctx.db, ctx.clock, fiona, key.id)

    removal: list[Any] = []

    def check_then_remove(*args: Any, **kw: Any) -> int:
        import asyncio

        removal.append(asyncio.get_running_loop().create_task(remove_now()))
        return checked(*args, **kw)

    monkeypatch.setattr(signatures, "check_assertion", check_then_remove)
    real_take = signatures.challenges.take

    async def take_after_removal(*args: Any, **kw: Any) -> Any:
        await removal[0]  # the removal has committed before the review goes on
        return await real_take(*args, **kw)

    monkeypatch.setattr(signatures.challenges, "take", take_after_removal)
    code = await refused(scene, fiona, approval_id, decision="approved", assertion=assertion)
    assert code == "credential_removed"
    assert (await scene.state(approval_id))["progress"][0]["approved"] == 0
