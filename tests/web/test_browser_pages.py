"""The page a finance approver would choose, in a real browser (Debian's Chromium through
Playwright, against a real ``cosigner serve``): formatted amounts equal to the canonical
minor units, a countdown that is right without JavaScript and ticks with it, the inbox
paged past 100 and sorted, the history filtered, the run panel, a revoked permit shown as
revoked, an axe-core accessibility check of every page, and the README screenshots
(``docs/screenshots/``) at 1280 px and 375 px."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from cosigner.web import amounts
from tests.conftest import ROOT, LiveServer, start_module_server
from tests.web.conftest import refund_request
from tests.web.test_browser import OUTPUT, Scene

pytestmark = pytest.mark.browser

AXE = Path(__file__).parent / "axe"
#: Where the screenshots go: test-output/screenshots on every run, and the README's own
#: docs/screenshots when ``COSIGNER_UPDATE_SCREENSHOTS=1`` (so a test run leaves the
#: checkout clean; README § Approver pages).
SCREENSHOTS = (ROOT / "docs" / "screenshots" if os.environ.get("COSIGNER_UPDATE_SCREENSHOTS")
               == "1" else OUTPUT / "screenshots")
WIDE = {"width": 1280, "height": 900}
PHONE = {"width": 375, "height": 812}
#: axe-core rule sets checked: WCAG 2.0/2.1/2.2 A and AA, and axe's best practices.
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"]
RUN = uuid.uuid4().hex[:8]
_counter = itertools.count()


def _axe_source() -> str:
    script = AXE / "node_modules" / "axe-core" / "axe.min.js"
    if not script.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm missing: run scripts/ensure-test-deps.sh (installs Node.js)")
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=AXE,
                       check=True, timeout=300)
    return script.read_text()


@pytest.fixture(scope="module")
def server(db_kind: str, pg_url: str | None, sqlite_template: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("browser-pages")
    live, _ = start_module_server(folder, db_kind=db_kind, pg_url=pg_url,
                                  sqlite_template=sqlite_template,
                                  bundle_dirs=[ROOT / "policies"],
                                  COSIGNER_PUBLIC_URL="http://127.0.0.1",
                                  COSIGNER_UI_LOCALE="en_US")
    yield live
    live.stop()


@pytest.fixture
def scene(server: LiveServer) -> Scene:
    return Scene(server, f"{RUN}p{next(_counter)}")


def _tab(browser: Any, viewport: dict[str, int], **options: Any) -> Any:
    context = browser.new_context(viewport=viewport, locale="en-US", **options)
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    return tab


def _axe(page: Any, name: str) -> list[dict[str, Any]]:
    """Run axe-core on the page; record every violation in test-output; return them."""
    page.evaluate(_axe_source())  # through the DevTools protocol: the page's CSP stays on
    result = page.evaluate("async (tags) => await axe.run(document, {runOnly: "
                           "{type: 'tag', values: tags}, resultTypes: ['violations']})",
                           AXE_TAGS)
    violations = [{"id": v["id"], "impact": v["impact"], "nodes": len(v["nodes"]),
                   "help": v["help"]} for v in result["violations"]]
    OUTPUT.mkdir(exist_ok=True)
    (OUTPUT / f"axe-{name}.json").write_text(json.dumps(
        {"page": page.url, "violations": violations,
         "passes": len(result.get("passes", []))}, indent=2))
    return violations


def _assert_accessible(page: Any, name: str) -> None:
    violations = _axe(page, name)
    serious = [v for v in violations if v["impact"] in ("serious", "critical")]
    assert serious == [], f"{name}: {serious}"
    assert violations == [], f"{name}: {violations}"


def _open_many(scene: Scene, bodies: list[dict[str, Any]]) -> list[str]:
    with ThreadPoolExecutor(max_workers=6) as pool:
        return [d["approval"]["id"] for d in pool.map(scene.decide, bodies)]


def _ids(page: Any) -> list[str]:
    return [str(row.get_attribute("data-id")) for row in page.locator("tbody tr[data-id]").all()]


def _sign_in(scene: Scene, page: Any, name: str, then: str = "/ui") -> None:
    page.goto(scene.server.url + then)
    page.fill("input[name=tenant]", scene.tenant)
    page.fill("input[name=name]", name)
    page.fill("input[name=password]", "correct horse battery staple")
    page.click("button[type=submit]")
    path = then.split("?")[0]  # the sign-in form returns to the path (not its query)
    page.wait_for_url(scene.server.url + path)
    if path != then:
        page.goto(scene.server.url + then)


def test_inbox_pages_past_100_sorts_and_is_accessible(scene: Scene, browser: Any) -> None:
    ids = _open_many(scene, [refund_request(100_001 + i, order_id=f"ord_{i}")
                             | {"run": {"id": f"run-{i}"}} for i in range(105)])
    scene.user("fiona", "finance")
    page = _tab(browser, WIDE)
    _sign_in(scene, page, "fiona", then="/ui?size=50")
    assert page.inner_text("#inbox-total") == "(105)"
    seen = [_ids(page)]
    while page.locator("#page-next").count():
        page.click("#page-next")
        seen.append(_ids(page))
    assert [len(p) for p in seen] == [50, 50, 5]
    assert sorted(i for p in seen for i in p) == sorted(ids)
    page.click("#page-prev")
    assert _ids(page) == seen[1]
    # Sort by creation, newest first, from the column header.
    page.goto(scene.server.url + "/ui?size=10")
    page.click("th a[data-sort=created]")
    assert page.get_attribute("th[aria-sort]", "aria-sort") == "descending"
    assert "Created" in page.inner_text("th[aria-sort]")
    newest = _ids(page)
    page.click("th a[data-sort=created]")
    assert page.get_attribute("th[aria-sort]", "aria-sort") == "ascending"
    assert _ids(page) != newest and len(_ids(page)) == 10
    _assert_accessible(page, "inbox")
    # The check can fail: an unlabelled control and an image without text are reported.
    page.evaluate("document.querySelector('main').insertAdjacentHTML('beforeend', "
                  "'<input id=bad><img src=/ui/static/none.png>')")
    found = {v["id"]: v["impact"] for v in _axe(page, "inbox-broken")}
    assert found.get("label") == "critical" and found.get("image-alt") == "critical"
    page.context.close()


def test_detail_shows_the_amount_a_ticking_countdown_and_the_run(scene: Scene,
                                                                 browser: Any) -> None:
    run = {"id": f"run-{uuid.uuid4().hex[:6]}"}
    earlier = scene.decide(refund_request(4_500, order_id="ord_77", currency="EUR")
                           | {"run": run})
    assert earlier["effect"] == "allow"
    reported = httpx.post(f"{scene.server.url}/v1/decisions/{earlier['decision_id']}/outcome",
                          headers=scene.runtime, timeout=10,
                          json={"outcome": "ok", "side_effect": "committed"})
    assert reported.status_code == 200, reported.text
    body = refund_request(135_000, order_id="ord_78", currency="EUR") | {"run": run}
    approval_id = scene.decide(body)["approval"]["id"]
    scene.user("fiona", "finance")

    # Without JavaScript: the server's time left and the absolute expiry are there.
    still = _tab(browser, WIDE, java_script_enabled=False)
    _sign_in(scene, still, "fiona", then=f"/ui/approvals/{approval_id}")
    static = still.inner_text("#time-left")
    assert static.endswith("UTC)") and ("30 min left" in static or "29 min left" in static)
    still.context.close()

    page = _tab(browser, WIDE)
    _sign_in(scene, page, "fiona", then=f"/ui/approvals/{approval_id}")
    amount = page.locator("#money dd.amount")
    shown = amount.inner_text()
    assert shown == "€1,350.00"
    assert amounts.minor_units(shown, str(amount.get_attribute("data-currency")),
                               "en_US") == body["args"]["amount_minor"]
    # The canonical arguments and their hash are one click away.
    assert not page.locator("#args").is_visible()
    page.click("#args-toggle")
    assert page.locator("#args").is_visible()
    assert '"amount_minor": 135000' in page.inner_text("#args")
    assert page.inner_text("#args-hash").startswith("sha256:")
    # The countdown ticks.
    ticking = page.locator("#time-left time.countdown")
    first = ticking.inner_text()
    assert " s left" in first  # the script shows seconds
    page.wait_for_function("(before) => document.querySelector('#time-left time')"
                           ".textContent !== before", arg=first, timeout=5000)
    # The run panel: the earlier refund (its outcome) and this request.
    rows = page.locator("#run tbody tr")
    assert rows.count() == 2
    assert "€45.00" in rows.nth(0).inner_text() and "committed" in rows.nth(0).inner_text()
    assert "this request" in rows.nth(1).inner_text()
    _assert_accessible(page, "detail")
    page.context.close()


def test_history_filters_and_shows_a_revoked_permit(scene: Scene, browser: Any) -> None:
    approved, rejected = _open_many(scene, [
        refund_request(150_000, order_id="ord_1") | {"run": {"id": "run-a"}},
        refund_request(180_000, order_id="ord_2", currency="GBP") | {"run": {"id": "run-b"}}])
    scene.user("fiona", "finance")
    page = _tab(browser, WIDE)
    _sign_in(scene, page, "fiona", then=f"/ui/approvals/{approved}")
    page.click("#approve")
    page.wait_for_selector("#permit")
    jti = scene.state(approved)["permit"]["jti"]
    admin_key = _admin_key(scene)
    revoked = httpx.post(f"{scene.server.url}/v1/permits/{jti}/revoke", timeout=10,
                         headers={"Authorization": f"Bearer {admin_key}"})
    assert revoked.status_code == 200, revoked.text
    page.reload()
    assert page.inner_text("#status") == "approved — permit revoked"
    assert page.locator("#permit-revoked").is_visible()
    page.goto(f"{scene.server.url}/ui/approvals/{rejected}")
    page.fill("#reject-comment", "already refunded by the card issuer")
    page.click("#reject")
    page.wait_for_url("**done=rejected")
    page.goto(scene.server.url + "/ui/history")
    assert sorted(_ids(page)) == sorted([approved, rejected])
    page.select_option("#filter-status", "rejected")
    page.click("#filter-apply")
    page.wait_for_url("**status=rejected**")
    assert _ids(page) == [rejected]
    assert "£1,800.00" in page.inner_text("#history")
    page.select_option("#filter-status", "approved")
    page.click("#filter-apply")
    page.wait_for_url("**status=approved**")
    assert _ids(page) == [approved]
    assert "approved — permit revoked" in page.inner_text("#history")
    page.fill("#filter-tool", "get_order")
    page.click("#filter-apply")
    assert _ids(page) == []
    page.goto(scene.server.url + "/ui/history")
    _assert_accessible(page, "history")
    page.context.close()


def _admin_key(scene: Scene) -> str:
    from tests.web.test_browser import cli

    return cli(scene.server, "principals", "add-key", "--tenant", scene.tenant, "--role",
               "admin", "--subject", "ops-admin")


def test_readme_screenshots_at_1280_and_375(scene: Scene, browser: Any) -> None:
    """The screenshots in README § Approver pages, taken from a live server."""
    run = {"id": "run-8472"}
    earlier = [refund_request(4_500, order_id="ord_8470", currency="EUR") | {"run": run},
               refund_request(2_000, order_id="ord_8471", currency="EUR") | {"run": run}]
    for body in earlier:
        decision = scene.decide(body)
        httpx.post(f"{scene.server.url}/v1/decisions/{decision['decision_id']}/outcome",
                   headers=scene.runtime, timeout=10,
                   json={"outcome": "ok", "side_effect": "committed"})
    detail_id = scene.decide(refund_request(135_000, order_id="ord_8472", currency="EUR")
                             | {"run": run})["approval"]["id"]
    _open_many(scene, [
        refund_request(182_050, order_id="ord_9120", currency="USD") | {"run": {"id": "run-9120"}},
        refund_request(118_000, order_id="ord_3391", currency="GBP",
                       reason_code="damaged_item") | {"run": {"id": "run-3391"}},
        refund_request(101_999, order_id="ord_5407", currency="EUR",
                       reason_code="not_delivered") | {"run": {"id": "run-5407"}}])
    scene.user("fiona", "finance")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for viewport, suffix in ((WIDE, "1280"), (PHONE, "375")):
        phone = viewport is PHONE
        page = _tab(browser, viewport, device_scale_factor=1, is_mobile=phone, has_touch=phone)
        _sign_in(scene, page, "fiona")
        assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
        page.screenshot(path=str(SCREENSHOTS / f"inbox-{suffix}.png"), full_page=True)
        page.goto(f"{scene.server.url}/ui/approvals/{detail_id}")
        assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
        assert page.locator("#approve").is_visible()
        page.screenshot(path=str(SCREENSHOTS / f"detail-{suffix}.png"), full_page=True)
        _assert_accessible(page, f"detail-{suffix}")
        page.context.close()
    for name in ("inbox-1280", "inbox-375", "detail-1280", "detail-375"):
        assert (SCREENSHOTS / f"{name}.png").stat().st_size > 10_000
