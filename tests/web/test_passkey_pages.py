"""The passkey pages and the signed review form over HTTP (no browser; a software
authenticator), on SQLite and PostgreSQL: CSRF on the JSON calls, registration checks,
and a signed approval through the same form the page's script posts."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from cosigner.core.clock import FrozenClock
from cosigner.core.review_statements import from_b64url
from tests.approvals.signed import signed_bundle
from tests.approvals.softkey import SoftAuthenticator
from tests.conftest import Harness, decision_request
from tests.web.conftest import add_user, csrf_of, sign_in, web_client

BASE = "http://cosigner.test"  # the harness client's origin, also the public URL here


@pytest.fixture
async def h(harness_factory: Any, tenant: str, tmp_path: Path) -> Harness:
    bundles = signed_bundle(tmp_path, tenant, require="[{'role': 'finance', 'count': 1}]")
    made: Harness = await harness_factory(
        public_url=BASE, bundle_dirs=[bundles],
        clock=FrozenClock(datetime(2026, 12, 1, 9, 0, tzinfo=UTC)))
    return made


async def signed_in(h: Harness, tenant: str, name: str = "fiona") -> tuple[httpx.AsyncClient,
                                                                          str]:
    await add_user(h.db, tenant, name, "finance", clock=h.context.clock)
    client = web_client(h, BASE)
    assert (await sign_in(client, tenant, name)).status_code == 303
    page = await client.get("/ui/passkeys")
    assert page.status_code == 200
    return client, csrf_of(page.text)


async def register(client: httpx.AsyncClient, csrf: str, **kw: Any) -> tuple[
        SoftAuthenticator, httpx.Response]:
    options = await client.post("/ui/passkeys/options", headers={"X-CSRF-Token": csrf})
    assert options.status_code == 200, options.text
    assert options.json()["rp"]["id"] == "cosigner.test"
    assert options.json()["authenticatorSelection"]["userVerification"] == "required"
    key = SoftAuthenticator("cosigner.test", BASE)
    done = await client.post("/ui/passkeys", headers={"X-CSRF-Token": csrf},
                             json={"credential": key.create(options.json(), **kw),
                                   "name": "laptop"})
    return key, done


async def pending(h: Harness, tenant: str) -> str:
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    resp = await h.client.post("/v1/decisions", headers=runtime, json=decision_request(
        tool={"name": "send_message"}, args={"to": "c-42", "body": "hello"}))
    return str(resp.json()["approval"]["id"])


async def test_json_calls_need_the_sessions_csrf_token(h: Harness, tenant: str) -> None:
    client, csrf = await signed_in(h, tenant)
    assert (await client.post("/ui/passkeys/options")).status_code == 403
    assert (await client.post("/ui/passkeys/options",
                              headers={"X-CSRF-Token": "0" * 64})).status_code == 403
    approval_id = await pending(h, tenant)
    sig = await client.post(f"/ui/approvals/{approval_id}/signature-options",
                            json={"decision": "approved"})
    assert sig.status_code == 403


async def test_register_then_sign_through_the_form(h: Harness, tenant: str) -> None:
    client, csrf = await signed_in(h, tenant)
    key, done = await register(client, csrf)
    assert done.status_code == 201 and done.json()["credential_id"] == key.id, done.text
    page = await client.get("/ui/passkeys")
    assert key.id in page.text and 'src="/ui/static/passkeys.js"' in page.text
    approval_id = await pending(h, tenant)
    detail = await client.get(f"/ui/approvals/{approval_id}")
    assert 'id="signature"' in detail.text
    options = await client.post(f"/ui/approvals/{approval_id}/signature-options",
                                headers={"X-CSRF-Token": csrf}, json={"decision": "approved"})
    assert options.status_code == 200, options.text
    body = options.json()
    assert body["statement"]["reviewer"] == "fiona"
    assert body["publicKey"]["userVerification"] == "required"
    assert [c["id"] for c in body["publicKey"]["allowCredentials"]] == [key.id]
    assertion = key.get(from_b64url(body["publicKey"]["challenge"]))
    args_hash = body["statement"]["args_hash"]
    review = await client.post(f"/ui/approvals/{approval_id}/review", data={
        "decision": "approved", "args_hash": args_hash, "csrf_token": csrf,
        "assertion": json.dumps(assertion)})
    assert review.status_code == 303, review.text
    runtime = await h.headers(tenant, "runtime")
    state = (await h.client.get(f"/v1/approvals/{approval_id}", headers=runtime)).json()
    assert state["status"] == "approved" and state["reviews"][0]["signed"] is True
    shown = await client.get(f"/ui/approvals/{approval_id}")
    assert "signed with a passkey" in shown.text


async def test_registration_is_single_use_and_needs_user_verification(
        h: Harness, tenant: str) -> None:
    client, csrf = await signed_in(h, tenant)
    _, without_uv = await register(client, csrf, uv=False)
    assert without_uv.status_code == 422 and without_uv.json()["code"] == "passkey_invalid"
    options = await client.post("/ui/passkeys/options", headers={"X-CSRF-Token": csrf})
    key = SoftAuthenticator("cosigner.test", BASE)
    credential = key.create(options.json())
    first = await client.post("/ui/passkeys", headers={"X-CSRF-Token": csrf},
                              json={"credential": credential})
    assert first.status_code == 201, first.text
    again = await client.post("/ui/passkeys", headers={"X-CSRF-Token": csrf},
                              json={"credential": credential})
    assert again.status_code == 422 and again.json()["code"] == "passkey_invalid"
    auditor = await h.headers(tenant, "auditor")
    events = await h.client.get("/v1/audit/export", headers=auditor, params={"format": "jsonl"})
    types = [json.loads(line)["body"]["type"] for line in events.text.splitlines()
             if '"kind":"event"' in line.replace(" ", "")]
    assert types.count("passkey.registered") == 1
    assert types.count("passkey.registration_refused") == 2


async def test_a_signing_challenge_expires(h: Harness, tenant: str) -> None:
    client, csrf = await signed_in(h, tenant)
    key, _ = await register(client, csrf)
    approval_id = await pending(h, tenant)
    options = (await client.post(f"/ui/approvals/{approval_id}/signature-options",
                                 headers={"X-CSRF-Token": csrf},
                                 json={"decision": "approved"})).json()
    h.context.clock.advance(seconds=121)  # type: ignore[attr-defined]
    assertion = key.get(from_b64url(options["publicKey"]["challenge"]))
    review = await client.post(f"/ui/approvals/{approval_id}/review", data={
        "decision": "approved", "args_hash": options["statement"]["args_hash"],
        "csrf_token": csrf, "assertion": json.dumps(assertion)})
    assert review.status_code == 409 and "expired; sign again" in review.text
