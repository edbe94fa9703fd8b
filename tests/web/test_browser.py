"""The approver form in a real browser: Debian's Chromium driven by Playwright, against a
real ``cosigner serve`` process. Accounts are made with the real CLI."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, LiveServer, start_module_server
from tests.web.conftest import PASSWORD, message_request, permit_claims, refund_request
from tests.web.conftest import review_bundle as make_review_bundle

pytestmark = pytest.mark.browser

OUTPUT = ROOT / "test-output"
SHORT_TTL_MS = 10_000  # long enough to open the page on a busy machine


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1024, "height": 800})
    tab = context.new_page()
    tab.set_default_timeout(10_000)
    yield tab
    context.close()


def cli(server: LiveServer, *args: str, stdin: str = "") -> str:
    done = subprocess.run([sys.executable, "-m", "cosigner", *args], input=stdin,
                          capture_output=True, text=True, env=server.env, cwd=ROOT,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class Scene:
    """A live server with a runtime key and helpers for one tenant."""

    def __init__(self, server: LiveServer, tenant: str) -> None:
        self.server, self.tenant = server, tenant
        key = cli(server, "principals", "add-key", "--tenant", tenant, "--role", "runtime",
                  "--subject", "agent-runtime")
        self.runtime = {"Authorization": f"Bearer {key}"}

    def user(self, name: str, *roles: str) -> None:
        role_args = [a for r in roles for a in ("--role", r)]
        cli(self.server, "principals", "add-user", name, "--tenant", self.tenant, *role_args,
            "--password-stdin", stdin=PASSWORD + "\n")

    def decide(self, body: dict[str, Any]) -> dict[str, Any]:
        response = httpx.post(self.server.url + "/v1/decisions", json=body,
                              headers=self.runtime, timeout=10)
        assert response.status_code == 200, response.text
        decision: dict[str, Any] = response.json()
        return decision

    def state(self, approval_id: str) -> dict[str, Any]:
        response = httpx.get(f"{self.server.url}/v1/approvals/{approval_id}",
                             headers=self.runtime, timeout=10)
        assert response.status_code == 200, response.text
        state: dict[str, Any] = response.json()
        return state

    def sign_in(self, page: Any, name: str, then: str = "/ui") -> None:
        page.goto(self.server.url + then)
        assert "/ui/login" in page.url  # not signed in: sent to the form
        page.fill("input[name=tenant]", self.tenant)
        page.fill("input[name=name]", name)
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(self.server.url + then)


@pytest.fixture(scope="module")
def server(db_kind: str, pg_url: str | None, sqlite_template: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One ``cosigner serve`` for the module (each test uses its own tenants)."""
    folder = tmp_path_factory.mktemp("browser")
    # Bundles for tenant-name patterns are read at start: one per test tenant suffix.
    for index in range(40):
        make_review_bundle(folder, f"{RUN}b{index}-msg")
        make_review_bundle(folder, f"{RUN}b{index}-short", timeout_ms=SHORT_TTL_MS)
    live, _ = start_module_server(
        folder, db_kind=db_kind, pg_url=pg_url, sqlite_template=sqlite_template,
        bundle_dirs=[ROOT / "policies", folder / "bundles"],
        COSIGNER_PUBLIC_URL="http://127.0.0.1")
    yield live
    live.stop()


_counter = itertools.count()
RUN = uuid.uuid4().hex[:8]  # tenants unique to this run (PostgreSQL is shared)


@pytest.fixture
def scene(server: LiveServer) -> Scene:
    """Fresh tenants ``bN`` (refund policy), ``bN-msg`` and ``bN-short`` (review bundles)."""
    return Scene(server, f"{RUN}b{next(_counter)}")


def test_sign_in_see_the_refund_approve_and_the_permit_binds_what_was_shown(
        scene: Scene, page: Any) -> None:
    body = refund_request()
    approval_id = scene.decide(body)["approval"]["id"]
    scene.user("fiona", "finance")
    scene.sign_in(page, "fiona")
    row = page.locator(f"tr[data-id='{approval_id}']")
    assert "issue_refund" in row.inner_text() and "$1,500.00" in row.inner_text()
    row.locator(f"a[href='/ui/approvals/{approval_id}']").click()
    shown_hash = page.inner_text("#args-hash")
    page.click("#args-toggle")  # the exact arguments are one click away
    assert '"amount_minor": 150000' in page.inner_text("#args")
    page.click("#approve")
    page.wait_for_selector("#permit")
    assert "You approved this request." in page.content()
    state = scene.state(approval_id)
    assert state["status"] == "approved"
    token = state["permit"]["token"]
    assert permit_claims(token)["args_hash"] == shown_hash
    redeemed = httpx.post(scene.server.url + "/v1/permits/redeem", headers=scene.runtime,
                          json={"permit": token, "tool": "issue_refund", "args": body["args"]})
    assert redeemed.status_code == 200, redeemed.text
    page.goto(scene.server.url + "/ui/history")
    assert "fiona" in page.inner_text("main") and "approved" in page.inner_text("main")


def test_reject_needs_a_comment(scene: Scene, page: Any) -> None:
    approval_id = scene.decide(refund_request())["approval"]["id"]
    scene.user("fiona", "finance")
    scene.sign_in(page, "fiona", then=f"/ui/approvals/{approval_id}")
    page.click("#reject")  # the required field stops the empty form in the browser
    assert scene.state(approval_id)["status"] == "pending"
    page.fill("#reject-comment", "customer already refunded by card issuer")
    page.click("#reject")
    page.wait_for_url("**done=rejected")
    assert "You rejected this request." in page.content()
    assert scene.state(approval_id)["status"] == "rejected"


def test_K13_self_approval_is_refused_on_the_page(scene: Scene, page: Any) -> None:
    approval_id = scene.decide(refund_request())["approval"]["id"]
    scene.user("agent-support", "finance")  # the initiator of the refund
    scene.sign_in(page, "agent-support")
    assert approval_id not in page.content()  # not offered in the inbox
    page.goto(f"{scene.server.url}/ui/approvals/{approval_id}")
    page.click("#approve")
    message = page.inner_text("[role=alert]")
    assert "You cannot approve a request you initiated" in message
    assert scene.state(approval_id)["status"] == "pending"


def test_post_without_csrf_token_is_refused(scene: Scene, page: Any) -> None:
    approval_id = scene.decide(refund_request())["approval"]["id"]
    scene.user("fiona", "finance")
    scene.sign_in(page, "fiona", then=f"/ui/approvals/{approval_id}")
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    shown_hash = page.inner_text("#args-hash")
    with httpx.Client(base_url=scene.server.url, cookies=cookies) as client:
        assert client.get("/ui").status_code == 200  # the session itself is good
        response = client.post(f"/ui/approvals/{approval_id}/review",
                               data={"decision": "approved", "args_hash": shown_hash})
    assert response.status_code == 403
    assert scene.state(approval_id)["status"] == "pending"


def test_xss_payload_is_shown_as_text(scene: Scene, page: Any) -> None:
    msg = Scene(scene.server, scene.tenant + "-msg")
    payload = '<script>alert(1)</script>" onmouseover="alert(2)'
    approval_id = msg.decide(message_request(body=payload))["approval"]["id"]
    msg.user("fiona", "finance")
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    msg.sign_in(page, "fiona")
    page.hover(f"a[href='/ui/approvals/{approval_id}']")
    page.click(f"a[href='/ui/approvals/{approval_id}']")
    page.click("#args-toggle")  # the exact arguments are one click away
    assert payload in page.inner_text("#args").replace('\\"', '"')
    page.hover("#args")
    # The one script is the page's own countdown, from /ui/static (CSP: 'self' only).
    assert page.locator("script:not([src='/ui/static/countdown.js'])").count() == 0
    assert dialogs == []


def test_expired_request_cannot_be_approved(scene: Scene, page: Any) -> None:
    msg = Scene(scene.server, scene.tenant + "-short")
    msg.user("fiona", "finance")
    msg.sign_in(page, "fiona")
    decision = msg.decide(message_request())
    # The server stamped the request before it answered: it expires SHORT_TTL_MS after a
    # moment no later than this one (timing the call from before it was sent clicked too
    # early when the answer took longer than the 0.2 s margin on a loaded machine).
    started = time.monotonic()
    approval_id = decision["approval"]["id"]
    page.goto(f"{scene.server.url}/ui/approvals/{approval_id}")
    assert "left" in page.inner_text("#time-left")
    time.sleep(max(0.0, SHORT_TTL_MS / 1000 + 0.2 - (time.monotonic() - started)))
    page.click("#approve")
    assert "expired" in page.inner_text("[role=alert]")
    assert page.locator("#approve").count() == 0
    assert msg.state(approval_id)["status"] == "expired"


def test_detail_page_at_phone_width(scene: Scene, browser: Any) -> None:
    approval_id = scene.decide(refund_request())["approval"]["id"]
    scene.user("fiona", "finance")
    context = browser.new_context(viewport={"width": 375, "height": 812},
                                  device_scale_factor=2, is_mobile=True, has_touch=True)
    try:
        phone = context.new_page()
        scene.sign_in(phone, "fiona", then=f"/ui/approvals/{approval_id}")
        width = phone.evaluate("document.documentElement.scrollWidth")
        assert width <= 375, f"page is {width}px wide at 375px"
        assert phone.locator("#approve").is_visible()
        OUTPUT.mkdir(exist_ok=True)
        phone.screenshot(path=str(OUTPUT / "approval-detail-375.png"), full_page=True)
    finally:
        context.close()
    assert (OUTPUT / "approval-detail-375.png").stat().st_size > 10_000
