"""Single sign-on and step-up end to end: headless Chromium, a real ``cosigner serve`` and a
real OpenID provider (npm ``oidc-provider``, tests/oidc/provider.mjs)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urljoin

import httpx
import pytest

from cosigner.core.subjects import subject_key
from tests.conftest import (
    ROOT,
    TEST_KEK,
    LiveServer,
    decision_request,
    free_port,
    migrated_database,
)
from tests.oidc.conftest import ACR_MFA, ACR_PWD, OTP, TestIdP, provider_settings

pytestmark = pytest.mark.browser

RUN = uuid.uuid4().hex[:8]
SSO = f"{RUN}-sso"          # single sign-on and passwords
SSO_ONLY = f"{RUN}-ssoonly"  # single sign-on only

RULES = """
def decide(input):
    approval = {'require': [{'role': 'finance', 'count': 1}], 'timeout_ms': 600000,
                'distinct_from': 'initiator_and_previous'}
    if input['tool']['name'] == 'wire_transfer':
        approval = {**approval, 'assurance': 'mfa', 'max_auth_age_s': 300}
    return {'effect': 'require_approval', 'reasons': ['reviewed'], 'approval': approval}
"""


def cli(server: LiveServer, *args: str, stdin: str = "") -> str:
    done = subprocess.run([sys.executable, "-m", "cosigner", *args], input=stdin,
                          capture_output=True, text=True, env=server.env, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def server(db_kind: str, pg_url: str | None, sqlite_template: Path, idp: TestIdP,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("sso")
    bundle = folder / "bundles" / f"stepup-{RUN}"
    bundle.mkdir(parents=True)
    (bundle / "manifest.toml").write_text(
        f'id = "stepup-{RUN}"\nversion = "1.0.0"\nengine = "python"\n'
        f'entrypoint = "decide"\ntenants = ["{SSO}", "{SSO_ONLY}"]\n')
    (bundle / "rules.py").write_text(RULES)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**__import__("os").environ,
           "COSIGNER_DATABASE_URL": migrated_database(folder, db_kind, pg_url, sqlite_template),
           "COSIGNER_KEY_DIR": str(folder / "keys"), "COSIGNER_KEY_ENCRYPTION_KEY": TEST_KEK,
           "COSIGNER_BUNDLE_DIRS": json.dumps([str(folder / "bundles")]),
           "COSIGNER_LOG_LEVEL": "warning", "COSIGNER_PUBLIC_URL": url,
           "COSIGNER_OIDC": json.dumps({
               SSO: provider_settings(idp),
               SSO_ONLY: provider_settings(idp, allow_passwords=False)})}
    live = LiveServer(env, port, log_path=folder / "server.log")
    live.start()
    idp.start([url + "/ui/oidc/callback"], folder / "idp.log")
    yield live
    live.stop()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1024, "height": 800})
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    yield tab
    context.close()


class Scene:
    def __init__(self, server: LiveServer, idp: TestIdP, tenant: str) -> None:
        self.server, self.idp, self.tenant = server, idp, tenant
        runtime = cli(server, "principals", "add-key", "--tenant", tenant, "--role", "runtime",
                      "--subject", f"runtime-{uuid.uuid4().hex[:6]}")
        auditor = cli(server, "principals", "add-key", "--tenant", tenant, "--role", "auditor",
                      "--subject", f"auditor-{uuid.uuid4().hex[:6]}")
        self.runtime = {"Authorization": f"Bearer {runtime}"}
        self.auditor = {"Authorization": f"Bearer {auditor}"}

    def decide(self, tool: str) -> str:
        body = decision_request(tool={"name": tool}, run={"id": f"run-{uuid.uuid4().hex}"},
                                args={"to": "acct-1", "amount_minor": 990_000})
        response = httpx.post(self.server.url + "/v1/decisions", json=body,
                              headers=self.runtime, timeout=10)
        assert response.status_code == 200, response.text
        return str(response.json()["approval"]["id"])

    def status(self, approval_id: str) -> str:
        response = httpx.get(f"{self.server.url}/v1/approvals/{approval_id}",
                             headers=self.runtime, timeout=10)
        return str(response.json()["status"])

    def events(self, type_: str, **query: str) -> list[dict[str, Any]]:
        response = httpx.get(self.server.url + "/v1/audit/events",
                             params={"type": type_, **query}, headers=self.auditor, timeout=10)
        assert response.status_code == 200, response.text
        return list(response.json()["events"])

    def subject(self, sub: str) -> str:
        return subject_key(f"oidc:{self.idp.issuer}#{sub}")

    def sso(self, page: Any, sub: str, *, then: str = "/ui", otp: str = "") -> None:
        """From the sign-in page through the provider's login form, back to Cosigner."""
        page.goto(f"{self.server.url}/ui/login?tenant={self.tenant}&next={quote(then)}")
        page.click("#sso")
        self.idp_login(page, sub, otp=otp)

    def idp_login(self, page: Any, sub: str, *, otp: str = "") -> None:
        page.wait_for_selector("#idp-login")
        page.fill("#idp-login", sub)
        if otp:
            page.fill("#idp-otp", otp)
        page.click("#idp-submit")
        page.wait_for_url(self.server.url + "/**")
        page.wait_for_load_state()
        # A successful callback answers with a page that refreshes to the target (a refused
        # one stays on its error page): wait for that refresh, or a navigation started
        # before it would be interrupted by it.
        if page.locator('meta[http-equiv="refresh"]').count():
            page.wait_for_url(lambda url: "/ui/oidc/callback" not in url)
            page.wait_for_load_state()


@pytest.fixture
def scene(server: LiveServer, idp: TestIdP) -> Scene:
    return Scene(server, idp, SSO)


def person(idp: TestIdP, *groups: str, tamper: str | None = None) -> str:
    # Mixed case on purpose: sub is case-sensitive and kept as spelt.
    return idp.account(f"Emp-{uuid.uuid4().hex[:10]}", *groups, tamper=tamper)


def test_sign_in_with_the_provider_and_approve(scene: Scene, page: Any) -> None:
    sub = person(scene.idp, "finance-approvers")
    approval_id = scene.decide("send_message")
    scene.sso(page, sub, then=f"/ui/approvals/{approval_id}")
    page.wait_for_url(f"{scene.server.url}/ui/approvals/{approval_id}")
    assert f"oidc:{scene.idp.issuer}#{sub}".lower() in page.inner_text("header").lower()
    page.click("#approve")
    page.wait_for_selector("#permit")
    assert scene.status(approval_id) == "approved"
    subject = scene.subject(sub)
    reviewed = scene.events("approval.reviewed", approval_id=approval_id)
    assert reviewed[0]["actor"]["subject"] == subject
    authn = reviewed[0]["payload"]["authn"]
    assert authn["method"] == "oidc" and authn["acr"] == ACR_PWD and authn["amr"] == ["pwd"]
    assert abs(authn["auth_time"] - time.time()) < 120
    signed_in = scene.events("web.signed_in", principal=subject)
    assert signed_in[-1]["payload"]["roles"] == ["finance"]


def test_roles_follow_the_groups_at_each_sign_in(scene: Scene, page: Any) -> None:
    sub = person(scene.idp, "treasury")
    scene.sso(page, sub)
    page.wait_for_url(scene.server.url + "/ui")  # signed in: the inbox, nothing in flight
    scene.idp.account(sub, "finance-approvers")
    page.context.clear_cookies()
    scene.sso(page, sub)
    updates = scene.events("principal.updated", principal=scene.subject(sub))
    assert updates[-1]["payload"]["roles"] == ["finance"]
    assert updates[-1]["payload"]["previous_roles"] == ["finance", "treasury"]


def test_step_up_refusal_then_a_stepped_up_review(scene: Scene, page: Any) -> None:
    sub = person(scene.idp, "finance-approvers")
    approval_id = scene.decide("wire_transfer")
    scene.sso(page, sub, then=f"/ui/approvals/{approval_id}")
    page.wait_for_url(f"{scene.server.url}/ui/approvals/{approval_id}")
    page.click("#approve")
    assert page.inner_text("#error-code") == "step_up_required"
    assert "multi-factor" in page.content()
    assert scene.status(approval_id) == "pending"
    refused = scene.events("approval.review_refused", approval_id=approval_id)
    assert refused[-1]["payload"]["code"] == "step_up_required"
    assert refused[-1]["payload"]["authn"]["acr"] == ACR_PWD
    page.click("#step-up")  # back through the provider, asking for MFA and a fresh login
    page.wait_for_selector("#idp-login")
    assert ACR_MFA in page.inner_text("#requested-acr")
    assert page.inner_text("#prompt") == "login"
    scene.idp_login(page, sub, otp=OTP)
    page.wait_for_url(f"{scene.server.url}/ui/approvals/{approval_id}")
    page.click("#approve")
    page.wait_for_selector("#permit")
    assert scene.status(approval_id) == "approved"
    authn = scene.events("approval.reviewed", approval_id=approval_id)[-1]["payload"]["authn"]
    assert authn["method"] == "oidc" and authn["acr"] == ACR_MFA
    assert "otp" in authn["amr"] and abs(authn["auth_time"] - time.time()) < 120
    signed_in = scene.events("web.signed_in", principal=scene.subject(sub))
    assert [e["payload"]["step_up"] for e in signed_in] == [
        None, {"acr_values": ACR_MFA, "max_age": 300}]


@pytest.mark.parametrize(("tamper", "code", "text"), [
    ("aud", "oidc_wrong_audience", "issued for another application"),
    ("signature", "oidc_bad_signature", "invalid signature"),
    ("expired", "oidc_expired", "has expired"),
])
def test_a_forged_id_token_is_refused_and_logged(scene: Scene, page: Any, tamper: str,
                                                 code: str, text: str) -> None:
    sub = person(scene.idp, "finance-approvers", tamper=tamper)
    scene.sso(page, sub)
    assert page.inner_text("#error-code") == code
    assert text in page.content() and "Nothing was signed in" in page.content()
    page.goto(scene.server.url + "/ui")
    assert "/ui/login" in page.url  # no session
    refused = scene.events("web.signin_refused")
    assert any(e["payload"]["code"] == code for e in refused)
    assert f"({code})" in scene.server.log_tail(20_000)


def test_a_replayed_id_token_nonce_is_refused(scene: Scene, page: Any) -> None:
    sub = person(scene.idp, "finance-approvers")
    scene.sso(page, sub)
    page.wait_for_url(scene.server.url + "/ui")
    page.context.clear_cookies()
    scene.idp.account(sub, "finance-approvers", tamper="replay")  # the previous ID token
    scene.sso(page, sub)
    assert page.inner_text("#error-code") == "oidc_nonce_mismatch"
    refused = scene.events("web.signin_refused")
    assert any(e["payload"]["code"] == "oidc_nonce_mismatch" for e in refused)


def test_a_replayed_state_is_refused(scene: Scene, page: Any) -> None:
    sub = person(scene.idp, "finance-approvers")
    callbacks: list[str] = []
    page.on("request", lambda r: callbacks.append(r.url) if "/ui/oidc/callback" in r.url
            else None)
    scene.sso(page, sub)
    page.wait_for_url(scene.server.url + "/ui")
    assert len(callbacks) == 1
    page.goto(callbacks[0])  # the same code and state again, same browser
    assert page.inner_text("#error-code") == "oidc_state_invalid"
    assert "already used" in page.content()
    assert "(oidc_state_invalid)" in scene.server.log_tail(20_000)


def test_a_state_only_works_in_the_browser_that_started_it(scene: Scene, page: Any,
                                                          browser: Any) -> None:
    """Login CSRF: a callback URL carried to another browser signs nobody in."""
    sub = person(scene.idp, "finance-approvers")
    page.goto(f"{scene.server.url}/ui/login?tenant={scene.tenant}")
    page.click("#sso")
    page.wait_for_selector("#idp-login")
    # Finish at the provider with this browser's cookies, but stop before the callback.
    action = page.get_attribute("form", "action")
    request = page.context.request
    done = request.post(urljoin(scene.idp.issuer, str(action)), form={"login": sub},
                        max_redirects=0)
    resumed = request.get(urljoin(scene.idp.issuer, done.headers["location"]),
                          max_redirects=0)
    callback = resumed.headers["location"]
    assert callback.startswith(scene.server.url + "/ui/oidc/callback?")
    other = browser.new_context()
    try:
        victim = other.new_page()
        victim.goto(callback)
        assert victim.inner_text("#error-code") == "oidc_state_invalid"
        victim.goto(scene.server.url + "/ui")
        assert "/ui/login" in victim.url
    finally:
        other.close()
    assert "(oidc_state_invalid): this sign-in was started in another browser" in \
        scene.server.log_tail(20_000)
    page.goto(callback)  # the state was spent by the other browser's attempt
    assert page.inner_text("#error-code") == "oidc_state_invalid"


def test_a_person_whose_groups_give_no_role_is_refused(scene: Scene, page: Any) -> None:
    sub = person(scene.idp, "sales", "everyone")
    scene.sso(page, sub)
    assert page.inner_text("#error-code") == "oidc_no_role"
    assert "none of your groups" in page.content()
    refused = scene.events("web.signin_refused", principal=scene.subject(sub))
    assert refused[-1]["payload"]["code"] == "oidc_no_role"
    assert refused[-1]["payload"]["claim_values"] == ["sales", "everyone"]
    page.goto(scene.server.url + "/ui")
    assert "/ui/login" in page.url


def test_passwords_switched_off_for_a_tenant(server: LiveServer, idp: TestIdP,
                                             page: Any) -> None:
    cli(server, "principals", "add-user", "pat", "--tenant", SSO_ONLY, "--role", "finance",
        "--password-stdin", stdin="correct horse battery staple\n")
    page.goto(f"{server.url}/ui/login?tenant={SSO_ONLY}")
    assert page.locator("#sso").count() == 1
    assert page.locator("#password-form").count() == 0
    page.goto(f"{server.url}/ui/login")
    page.fill("#password-form input[name=tenant]", SSO_ONLY)
    page.fill("#password-form input[name=name]", "pat")
    page.fill("#password-form input[name=password]", "correct horse battery staple")
    page.click("#password-form button[type=submit]")
    assert "single sign-on only" in page.content()
    page.goto(server.url + "/ui")
    assert "/ui/login" in page.url
    assert "refused password sign-in for tenant " + SSO_ONLY in server.log_tail(20_000)
