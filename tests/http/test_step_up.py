"""Step-up requirements over HTTP (no browser, SQLite and PostgreSQL): API keys and
password sessions never meet them; a single sign-on session meets them only with the
asked-for assurance, acr and authentication age; every refusal is logged with ``authn``."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from cosigner.core.clock import FrozenClock
from cosigner.db.tables import audit_events
from cosigner.identity import oidc_signin
from cosigner.identity.oidc import IdToken
from cosigner.web import sessions
from tests.conftest import Harness
from tests.http.approval_helpers import decide, review, scripted, write_scripted_bundle
from tests.web.conftest import add_user, csrf_of, sign_in, web_client

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
ISSUER = "https://idp.example.test"
ACR_PWD, ACR_MFA, ACR_HWK = "urn:acme:pwd", "urn:acme:mfa", "urn:acme:hwk"


def provider(**overrides: Any) -> dict[str, Any]:
    return {"issuer": ISSUER, "client_id": "cosigner", "client_secret": "s3cret",
            "role_map": {"fin": ["finance"]}, "acr_values": [ACR_PWD, ACR_MFA, ACR_HWK],
            "mfa_acr_values": [ACR_MFA, ACR_HWK], **overrides}


def stepped(**step_up: Any) -> dict[str, Any]:
    return {"effect": "require_approval", "reasons": ["scripted"],
            "approval": {"require": [{"role": "finance", "count": 1}], "timeout_ms": 600_000,
                         "distinct_from": "initiator_and_previous", **step_up}}


@pytest.fixture
async def sh(harness_factory: Callable[..., Any], tmp_path: Path, tenant: str) -> Harness:
    clock = FrozenClock(T0)
    h: Harness = await harness_factory(bundle_dirs=[write_scripted_bundle(tmp_path / "b")],
                                       clock=clock, oidc={tenant: provider()})
    return h


async def refusals(h: Harness, tenant: str) -> list[dict[str, Any]]:
    async with h.db.read() as conn:
        rows = (await conn.execute(select(audit_events.c.body).where(
            audit_events.c.tenant == tenant, audit_events.c.type == "approval.review_refused")
            .order_by(audit_events.c.seq))).scalars().all()
    return [json.loads(r)["payload"] for r in rows]


async def reviewed(h: Harness, tenant: str) -> list[dict[str, Any]]:
    async with h.db.read() as conn:
        rows = (await conn.execute(select(audit_events.c.body).where(
            audit_events.c.tenant == tenant, audit_events.c.type == "approval.reviewed")
            .order_by(audit_events.c.seq))).scalars().all()
    return [json.loads(r)["payload"] for r in rows]


async def test_an_api_key_review_is_refused_with_step_up_required(sh: Harness,
                                                                  tenant: str) -> None:
    runtime = await sh.headers(tenant, "runtime", subject="orchestrator")
    fiona = await sh.headers(tenant, "finance", subject="fiona")
    approval_id = (await decide(sh, runtime, scripted(stepped(assurance="mfa",
                                                             max_auth_age_s=300))))["approval"]["id"]
    for decision in ("approved", "rejected"):
        resp = await review(sh, fiona, approval_id, decision=decision)
        assert resp.status_code == 403, resp.text
        problem = resp.json()
        assert problem["code"] == "step_up_required"
        assert problem["step_up"] == {"assurance": "mfa", "max_auth_age_s": 300}
        assert problem["detail"] == ("an API key cannot meet this request's step-up; sign "
                                     "in with single sign-on")
    state = (await sh.client.get(f"/v1/approvals/{approval_id}", headers=runtime)).json()
    assert state["status"] == "pending" and state["reviews"] == []
    assert state["step_up"] == {"assurance": "mfa", "min_acr": None, "max_auth_age_s": 300}
    logged = await refusals(sh, tenant)
    assert [(p["code"], p["decision"], p["authn"]) for p in logged] == [
        ("step_up_required", "approved", {"method": "api_key"}),
        ("step_up_required", "rejected", {"method": "api_key"})]


async def test_without_step_up_an_api_key_review_records_its_authn(sh: Harness,
                                                                   tenant: str) -> None:
    runtime = await sh.headers(tenant, "runtime", subject="orchestrator")
    fiona = await sh.headers(tenant, "finance", subject="fiona")
    approval_id = (await decide(sh, runtime, scripted(stepped())))["approval"]["id"]
    assert (await review(sh, fiona, approval_id)).status_code == 200
    assert (await reviewed(sh, tenant))[0]["authn"] == {"method": "api_key"}
    state = (await sh.client.get(f"/v1/approvals/{approval_id}", headers=runtime)).json()
    assert state["step_up"] is None


async def test_a_later_stage_may_ask_for_step_up(sh: Harness, tenant: str) -> None:
    runtime = await sh.headers(tenant, "runtime", subject="orchestrator")
    fiona = await sh.headers(tenant, "finance", subject="fiona")
    result = stepped()
    result["approval"]["timeout_ms"] = 60_000
    result["approval"]["on_expired"] = {"require": [{"role": "finance", "count": 1}],
                                        "timeout_ms": 60_000, "assurance": "mfa"}
    approval_id = (await decide(sh, runtime, scripted(result)))["approval"]["id"]
    sh.context.clock.advance(seconds=61)  # type: ignore[attr-defined]
    resp = await review(sh, fiona, approval_id)
    assert (resp.status_code, resp.json()["code"]) == (403, "step_up_required")
    state = (await sh.client.get(f"/v1/approvals/{approval_id}", headers=runtime)).json()
    assert state["stage"] == 2 and state["status"] == "pending"
    assert state["step_up"] == {"assurance": "mfa", "min_acr": None, "max_auth_age_s": None}


async def _oidc_session(h: Harness, tenant: str, *, acr: str, amr: list[str],
                        auth_time: datetime) -> str:
    """A web session as the single sign-on callback makes it (the ID token's checks are
    tests/identity/test_oidc_claims.py's and the browser tests')."""
    token = IdToken({"sub": f"u-{uuid.uuid4().hex[:8]}", "groups": ["fin"], "acr": acr,
                     "amr": amr, "auth_time": int(auth_time.timestamp())})
    caller = await oidc_signin.sign_in(h.db, tenant=tenant, provider=h.settings.oidc[tenant],
                                       token=token, clock=h.context.clock)
    return await sessions.create(h.db, caller, now=h.context.clock())


async def _form_review(h: Harness, raw: str | None, approval_id: str, *,
                       client: httpx.AsyncClient | None = None) -> httpx.Response:
    client = client or web_client(h)
    if raw is not None:
        client.cookies.set(sessions.COOKIE, raw, domain="cosigner.test", path="/ui")
    page = await client.get(f"/ui/approvals/{approval_id}")
    assert page.status_code == 200, page.text
    shown = re.search(r'id="args-hash">([^<]+)<', page.text)
    assert shown
    return await client.post(f"/ui/approvals/{approval_id}/review", data={
        "decision": "approved", "comment": "ok", "args_hash": shown.group(1),
        "csrf_token": csrf_of(page.text)})


@pytest.mark.parametrize(("acr", "amr", "age_s", "ask", "ok"), [
    (ACR_PWD, ["pwd"], 10, {"assurance": "mfa"}, False),
    (ACR_PWD, ["pwd", "otp"], 10, {"assurance": "mfa"}, True),   # RFC 8176 amr
    (ACR_MFA, ["pwd"], 10, {"assurance": "mfa"}, True),          # a configured MFA acr
    (ACR_MFA, ["pwd"], 10, {"min_acr": ACR_HWK}, False),         # below in the order
    (ACR_HWK, ["hwk"], 10, {"min_acr": ACR_MFA}, True),          # above in the order
    ("urn:other", ["hwk"], 10, {"min_acr": ACR_PWD}, False),     # not in the order
    (ACR_MFA, ["otp"], 301, {"assurance": "mfa", "max_auth_age_s": 300}, False),
    (ACR_MFA, ["otp"], 300, {"assurance": "mfa", "max_auth_age_s": 300}, True),
])
async def test_a_single_sign_on_session_meets_step_up_only_as_asked(
        sh: Harness, tenant: str, acr: str, amr: list[str], age_s: int,
        ask: dict[str, Any], ok: bool) -> None:
    from datetime import timedelta

    runtime = await sh.headers(tenant, "runtime", subject="orchestrator")
    approval_id = (await decide(sh, runtime, scripted(stepped(**ask))))["approval"]["id"]
    raw = await _oidc_session(sh, tenant, acr=acr, amr=amr,
                              auth_time=T0 - timedelta(seconds=age_s))
    async with web_client(sh) as client:
        resp = await _form_review(sh, raw, approval_id, client=client)
    if ok:
        assert resp.status_code == 303, resp.text
        authn = (await reviewed(sh, tenant))[0]["authn"]
        assert authn == {"method": "oidc", "acr": acr, "amr": amr,
                         "auth_time": int(T0.timestamp()) - age_s}
    else:
        assert resp.status_code == 403
        assert 'id="error-code">step_up_required<' in resp.text
        link = re.search(r'id="step-up" class="button primary" href="([^"]+)"', resp.text)
        assert link and "step_up=1" in link.group(1)
        assert (await refusals(sh, tenant))[-1]["authn"]["method"] == "oidc"


async def test_a_password_session_never_meets_step_up(sh: Harness, tenant: str) -> None:
    runtime = await sh.headers(tenant, "runtime", subject="orchestrator")
    approval_id = (await decide(sh, runtime, scripted(stepped(assurance="mfa"))))[
        "approval"]["id"]
    await add_user(sh.db, tenant, "paula", "finance", clock=sh.context.clock)
    async with web_client(sh) as client:
        assert (await sign_in(client, tenant, "paula")).status_code == 303
        resp = await _form_review(sh, None, approval_id, client=client)
    assert resp.status_code == 403 and "step_up_required" in resp.text
    assert (await refusals(sh, tenant))[-1]["authn"] == {"method": "password"}
