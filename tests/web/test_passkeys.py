"""Signed approvals in a real browser (issue 22): Debian's Chromium with a CDP virtual
authenticator (ctap2, internal transport, user verification), against a real ``cosigner
serve`` on ``localhost`` (WebAuthn needs a secure context: https, or http on localhost).

What the page's script does is driven through the UI; the refusals send what a hostile
script would (an assertion made by the real authenticator, then tampered, reused, sent for
another request, or made without user verification) to the same form endpoint."""

from __future__ import annotations

import base64
import itertools
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.approvals.signed import signed_bundle
from tests.conftest import LiveServer, decision_request, free_port, migrated_database
from tests.web.conftest import PASSWORD, permit_claims
from tests.web.test_browser import cli

pytestmark = pytest.mark.browser

RUN = uuid.uuid4().hex[:8]
_counter = itertools.count()
TENANTS = 12

#: Signs like passkeys.js but lets the test weaken the options (as a hostile script could).
SIGN = """async ([approvalId, decision, userVerification]) => {
  const csrf = document.querySelector("input[name=csrf_token]").value;
  const response = await fetch(`/ui/approvals/${approvalId}/signature-options`, {
    method: "POST", headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
    body: JSON.stringify({decision})});
  if (!response.ok) { throw new Error(await response.text()); }
  const options = (await response.json()).publicKey;
  const bytes = (t) => Uint8Array.from(atob(t.replace(/-/g, "+").replace(/_/g, "/")),
                                       (c) => c.charCodeAt(0));
  const text = (b) => btoa(String.fromCharCode(...new Uint8Array(b)))
    .replace(/\\+/g, "-").replace(/\\//g, "_").replace(/=+$/, "");
  options.challenge = bytes(options.challenge);
  options.allowCredentials = options.allowCredentials.map((c) => ({...c, id: bytes(c.id)}));
  if (userVerification) { options.userVerification = userVerification; }
  const a = await navigator.credentials.get({publicKey: options});
  return {id: a.id, rawId: text(a.rawId), type: a.type, response: {
    authenticatorData: text(a.response.authenticatorData),
    clientDataJSON: text(a.response.clientDataJSON), signature: text(a.response.signature)}};
}"""


@pytest.fixture(scope="module")
def server(db_kind: str, pg_url: str | None, sqlite_template: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One ``cosigner serve`` whose public URL is ``http://localhost:<port>``."""
    import os

    from tests.conftest import TEST_KEK

    folder = tmp_path_factory.mktemp("passkeys")
    for index in range(TENANTS):  # bundles are read at start: one per test tenant
        signed_bundle(folder, f"{RUN}p{index}", require="[{'role': 'finance', 'count': 2}]")
    port = free_port()
    env = {**os.environ,
           "COSIGNER_DATABASE_URL": migrated_database(folder, db_kind, pg_url,
                                                      sqlite_template),
           "COSIGNER_KEY_DIR": str(folder / "keys"), "COSIGNER_KEY_ENCRYPTION_KEY": TEST_KEK,
           "COSIGNER_BUNDLE_DIRS": json.dumps([str(folder / "bundles")]),
           "COSIGNER_LOG_LEVEL": "warning", "COSIGNER_PUBLIC_URL": f"http://localhost:{port}"}
    live = LiveServer(env, port, log_path=folder / "server.log")
    live.start()
    yield live
    live.stop()


class Scene:
    def __init__(self, server: LiveServer, chromium: Any) -> None:
        self.server, self.tenant = server, f"{RUN}p{next(_counter)}"
        self.url = f"http://localhost:{server.port}"
        key = cli(server, "principals", "add-key", "--tenant", self.tenant, "--role",
                  "runtime", "--subject", "agent-runtime")
        self.runtime = {"Authorization": f"Bearer {key}"}
        self.context = chromium.new_context(viewport={"width": 1024, "height": 800})
        self.page = self.context.new_page()
        self.page.set_default_timeout(10_000)
        self.cdp = self.context.new_cdp_session(self.page)
        self.cdp.send("WebAuthn.enable")
        self.authenticator = self.cdp.send("WebAuthn.addVirtualAuthenticator", {"options": {
            "protocol": "ctap2", "transport": "internal", "hasResidentKey": True,
            "hasUserVerification": True, "isUserVerified": True,
            "automaticPresenceSimulation": True}})["authenticatorId"]

    def user(self, name: str, *roles: str) -> None:
        role_args = [a for r in roles for a in ("--role", r)]
        cli(self.server, "principals", "add-user", name, "--tenant", self.tenant, *role_args,
            "--password-stdin", stdin=PASSWORD + "\n")

    def sign_in(self, name: str) -> None:
        self.page.goto(self.url + "/ui/login")
        self.page.fill("input[name=tenant]", self.tenant)
        self.page.fill("input[name=name]", name)
        self.page.fill("input[name=password]", PASSWORD)
        self.page.click("button[type=submit]")
        self.page.wait_for_url(self.url + "/ui")

    def register(self, name: str = "laptop") -> str:
        self.page.goto(self.url + "/ui/passkeys")
        before = self.page.locator("[data-credential]").count()
        self.page.fill("#passkey-name", name)
        self.page.click("#add-passkey")
        self.page.locator("[data-credential]").nth(before).wait_for()
        ids = self.page.eval_on_selector_all(
            "[data-credential]", "els => els.map(e => e.dataset.credential)")
        return str(ids[-1])

    def decide(self) -> tuple[str, dict[str, Any]]:
        args = {"to": "customer-42", "body": uuid.uuid4().hex}
        body = decision_request(tool={"name": "send_message"}, args=args)
        response = httpx.post(self.url + "/v1/decisions", headers=self.runtime, timeout=10,
                              json=body)
        assert response.status_code == 200, response.text
        return str(response.json()["approval"]["id"]), args

    def state(self, approval_id: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/v1/approvals/{approval_id}", headers=self.runtime,
                             timeout=10)
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        return data

    def assertion(self, approval_id: str, *, on: str | None = None,
                  user_verification: str | None = None) -> dict[str, Any]:
        """An assertion from the virtual authenticator for ``approval_id``, made on the
        page of ``on`` (default: the same request)."""
        self.page.goto(f"{self.url}/ui/approvals/{on or approval_id}")
        signed: dict[str, Any] = self.page.evaluate(
            SIGN, [approval_id, "approved", user_verification])
        return signed

    def submit(self, approval_id: str, assertion: dict[str, Any]) -> httpx.Response:
        """POST the review form with ``assertion``, as the signed-in browser session."""
        self.page.goto(f"{self.url}/ui/approvals/{approval_id}")
        cookies = {c["name"]: c["value"] for c in self.context.cookies()}
        form = {"decision": "approved", "comment": "",
                "args_hash": self.page.inner_text("#args-hash"),
                "csrf_token": self.page.input_value("input[name=csrf_token]"),
                "assertion": json.dumps(assertion)}
        with httpx.Client(base_url=self.url, cookies=cookies,
                          headers={"Origin": self.url}) as client:
            return client.post(f"/ui/approvals/{approval_id}/review", data=form)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def scene(server: LiveServer, browser: Any) -> Iterator[Scene]:
    made = Scene(server, browser)
    yield made
    made.close()


def refused(response: httpx.Response, text: str) -> None:
    assert response.status_code == 409, response.text[:500]
    assert text in response.text


def test_register_a_passkey_and_signed_approvals_count_and_the_permit_redeems(
        scene: Scene) -> None:
    from cosigner_client.approver_signatures import verify_approver_signatures

    scene.user("fiona", "finance")
    scene.user("gus", "finance")
    approval_id, args = scene.decide()
    credentials = {}
    for name in ("fiona", "gus"):
        scene.context.clear_cookies()
        scene.sign_in(name)
        credentials[name] = scene.register()
        scene.page.goto(f"{scene.url}/ui/approvals/{approval_id}")
        assert "asks for your passkey" in scene.page.inner_text("#signature")
        scene.page.click("#approve")
        scene.page.wait_for_url("**done=approved")
    scene.page.wait_for_selector("#permit")
    state = scene.state(approval_id)
    assert state["status"] == "approved" and all(r["signed"] for r in state["reviews"])
    claims = permit_claims(state["permit"]["token"])
    assert {a["id"]: a["signature"]["credential_id"] for a in claims["approvers"]} == \
        credentials
    keys = httpx.get(scene.url + "/v1/approvers/keys", headers=scene.runtime).json()
    assert sorted(verify_approver_signatures(claims, keys, require=True)) == ["fiona", "gus"]
    redeemed = httpx.post(scene.url + "/v1/permits/redeem", headers=scene.runtime, json={
        "permit": state["permit"]["token"], "tool": "send_message", "args": args})
    assert redeemed.status_code == 200, redeemed.text


def test_tampered_client_data_is_refused(scene: Scene) -> None:
    scene.user("fiona", "finance")
    scene.sign_in("fiona")
    scene.register()
    approval_id, _ = scene.decide()
    assertion = scene.assertion(approval_id)
    raw = assertion["response"]["clientDataJSON"]
    client = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    client["origin"] = "https://evil.example"
    assertion["response"]["clientDataJSON"] = base64.urlsafe_b64encode(
        json.dumps(client).encode()).rstrip(b"=").decode()
    refused(scene.submit(approval_id, assertion), "did not verify")
    assert scene.state(approval_id)["progress"][0]["approved"] == 0


def test_assertion_for_another_request_is_refused(scene: Scene) -> None:
    scene.user("fiona", "finance")
    scene.sign_in("fiona")
    scene.register()
    first, _ = scene.decide()
    second, _ = scene.decide()
    refused(scene.submit(first, scene.assertion(second)), "for another request")
    assert scene.state(first)["progress"][0]["approved"] == 0


def test_replayed_assertion_is_refused(scene: Scene) -> None:
    scene.user("fiona", "finance")
    scene.sign_in("fiona")
    scene.register()
    approval_id, _ = scene.decide()
    assertion = scene.assertion(approval_id)
    assert scene.submit(approval_id, assertion).status_code == 303  # counted once
    refused(scene.submit(approval_id, assertion), "already used")
    assert scene.state(approval_id)["progress"][0]["approved"] == 1


def test_removed_passkey_is_refused(scene: Scene) -> None:
    scene.user("fiona", "finance")
    scene.sign_in("fiona")
    scene.register()
    approval_id, _ = scene.decide()
    assertion = scene.assertion(approval_id)
    scene.page.goto(scene.url + "/ui/passkeys")
    scene.page.click(".remove-passkey")
    scene.page.wait_for_url("**done=removed")
    assert scene.page.locator("[data-credential]").count() == 0
    refused(scene.submit(approval_id, assertion), "was removed")
    scene.page.goto(f"{scene.url}/ui/approvals/{approval_id}")
    scene.page.click("#approve")  # no passkey left to sign with
    scene.page.wait_for_selector("#signature-status:not([hidden])")
    assert "Register a passkey first" in scene.page.inner_text("#signature-status")
    assert scene.state(approval_id)["progress"][0]["approved"] == 0


def test_missing_user_verification_is_refused(scene: Scene) -> None:
    scene.user("fiona", "finance")
    scene.sign_in("fiona")
    scene.register()
    approval_id, _ = scene.decide()
    scene.cdp.send("WebAuthn.setUserVerified", {"authenticatorId": scene.authenticator,
                                                "isUserVerified": False})
    # A hostile script asks the authenticator not to verify the user: the server refuses.
    assertion = scene.assertion(approval_id, user_verification="discouraged")
    raw = base64.urlsafe_b64decode(assertion["response"]["authenticatorData"] + "==")
    assert raw[32] & 0x04 == 0  # the UV flag is really unset
    refused(scene.submit(approval_id, assertion), "did not verify")
    # And the page's own script, which requires verification, gets no signature at all.
    scene.page.goto(f"{scene.url}/ui/approvals/{approval_id}")
    scene.page.click("#approve")
    scene.page.wait_for_selector("#signature-status:not([hidden])")
    assert scene.state(approval_id)["progress"][0]["approved"] == 0


def test_unsigned_and_api_key_reviews_are_refused(scene: Scene) -> None:
    scene.user("fiona", "finance")
    approval_id, _ = scene.decide()
    key = cli(scene.server, "principals", "add-key", "--tenant", scene.tenant, "--role",
              "finance", "--subject", "finance-bot")
    response = httpx.post(f"{scene.url}/v1/approvals/{approval_id}/reviews",
                          headers={"Authorization": f"Bearer {key}"},
                          json={"decision": "approved"})
    assert response.status_code == 409 and response.json()["code"] == "signature_required"
    scene.sign_in("fiona")
    cookies = {c["name"]: c["value"] for c in scene.context.cookies()}
    scene.page.goto(f"{scene.url}/ui/approvals/{approval_id}")
    with httpx.Client(base_url=scene.url, cookies=cookies,
                      headers={"Origin": scene.url}) as client:  # the form without script
        response = client.post(f"/ui/approvals/{approval_id}/review", data={
            "decision": "approved", "args_hash": scene.page.inner_text("#args-hash"),
            "csrf_token": scene.page.input_value("input[name=csrf_token]")})
    refused(response, "must be approved with your own passkey")
    assert scene.state(approval_id)["progress"][0]["approved"] == 0


def test_passkey_script_is_same_origin_under_the_csp(scene: Scene) -> None:
    scene.user("fiona", "finance")
    errors: list[str] = []
    scene.page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    scene.sign_in("fiona")
    response = scene.page.goto(scene.url + "/ui/passkeys")
    assert response is not None
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert scene.page.locator("script[src='/ui/static/passkeys.js']").count() == 1
    assert scene.page.locator("script:not([src])").count() == 0
    assert scene.page.evaluate("typeof window.cosignerPasskeys.signReview") == "function"
    assert errors == []

