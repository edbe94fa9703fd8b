"""The approver pages a finance team would choose (over HTTP, no browser; SQLite and
PostgreSQL): formatted amounts equal to the canonical minor units, server-rendered time
left, the inbox paged past 100 and sorted, the history filtered and paged, the run panel,
a revoked permit shown as revoked, and tenancy on every list."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from html import unescape
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from cosigner.core.clock import FrozenClock
from cosigner.db.tables_approvals import approvals
from cosigner.web import amounts
from tests.conftest import ROOT
from tests.web.conftest import (
    add_user,
    csrf_of,
    message_request,
    refund_request,
    review_bundle,
    sign_in,
    web_client,
)

_ROW = re.compile(r'<tr data-id="([0-9a-f-]+)"')
_NEXT = re.compile(r'<a href="([^"]+)" id="page-next"')
_PREV = re.compile(r'<a href="([^"]+)" id="page-prev"')
_AMOUNT = re.compile(r'class="amount" data-minor="(\d+)" data-currency="([A-Z]{3})">([^<]+)<')


def _rows(html: str) -> list[str]:
    return _ROW.findall(html)


def _link(pattern: re.Pattern[str], html: str) -> str | None:
    match = pattern.search(html)
    return unescape(match.group(1)) if match else None


async def _decide(h: Any, runtime: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    response = await h.client.post("/v1/decisions", json=body, headers=runtime)
    assert response.status_code == 200, response.text
    decision: dict[str, Any] = response.json()
    return decision


async def _open_many(h: Any, tenant: str, count: int, *, tool_of: Any = None) -> list[str]:
    """``count`` pending refund approvals, each in its own run; their ids in order."""
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    ids: list[str] = []
    for start in range(0, count, 25):
        bodies = [refund_request(150_000 + i, order_id=f"ord_{i}") | {"run": {"id": f"run-{i}"}}
                  for i in range(start, min(start + 25, count))]
        decisions = await asyncio.gather(*(_decide(h, runtime, b) for b in bodies))
        ids += [d["approval"]["id"] for d in decisions]
    return ids


@asynccontextmanager
async def _signed_in(h: Any, tenant: str, name: str = "fiona",
                     *roles: str) -> AsyncIterator[httpx.AsyncClient]:
    await add_user(h.db, tenant, name, *(roles or ("finance",)), clock=h.context.clock)
    async with web_client(h) as client:
        client.headers["Accept-Language"] = "en-US"
        assert (await sign_in(client, tenant, name)).status_code == 303
        yield client


async def _review(client: httpx.AsyncClient, approval_id: str, html: str, decision: str,
                  comment: str = "") -> None:
    shown = re.search(r'id="args-hash">([^<]+)<', html)
    assert shown
    response = await client.post(f"/ui/approvals/{approval_id}/review", data={
        "decision": decision, "comment": comment, "csrf_token": csrf_of(html),
        "args_hash": shown.group(1)})
    assert response.status_code == 303, response.text


async def _walk(client: httpx.AsyncClient, first: str) -> tuple[list[list[str]], str]:
    """Every page from ``first`` by its Next links; the pages' ids and the last page."""
    pages, url = [], first
    while True:
        response = await client.get(url)
        assert response.status_code == 200
        pages.append(_rows(response.text))
        nxt = _link(_NEXT, response.text)
        if nxt is None:
            return pages, response.text
        url = nxt


async def test_the_amount_shown_is_the_canonical_minor_units_in_the_locale(
        harness: Any, tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime", subject="agent-runtime")
    body = refund_request(135_000, currency="EUR")
    approval_id = (await _decide(harness, runtime, body))["approval"]["id"]
    async with _signed_in(harness, tenant) as client:
        for language, locale, text in (("en-US", "en_US", "€1,350.00"),
                                       ("de-DE,de;q=0.9", "de_DE", "1.350,00\xa0€")):
            page = await client.get(f"/ui/approvals/{approval_id}",
                                    headers={"Accept-Language": language})
            minor, currency, shown = _AMOUNT.findall(page.text)[0]
            assert unescape(shown) == text and currency == "EUR"
            assert amounts.minor_units(unescape(shown), currency, locale) == int(minor) \
                == body["args"]["amount_minor"]
            # The exact canonical arguments (what the hash covers) are one click away.
            assert '<details class="exact" id="exact">' in page.text
            assert '"amount_minor": 135000' in unescape(page.text)
            inbox = (await client.get("/ui", headers={"Accept-Language": language})).text
            assert text in unescape(inbox)


async def test_ui_locale_setting_is_used_when_the_browser_is_not_asked(
        harness_factory: Any, tenant: str) -> None:
    h = await harness_factory(ui_locale="de_DE", ui_locale_from_browser=False)
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    approval_id = (await _decide(h, runtime, refund_request(135_000, currency="EUR")))[
        "approval"]["id"]
    async with _signed_in(h, tenant) as client:
        page = await client.get(f"/ui/approvals/{approval_id}")
    assert "1.350,00\xa0€" in unescape(page.text)


async def test_time_left_is_rendered_by_the_server_and_ticked_by_a_same_origin_script(
        harness_factory: Any, tenant: str) -> None:
    clock = FrozenClock(datetime(2030, 1, 1, 12, tzinfo=UTC))
    h = await harness_factory(clock=clock, session_idle_timeout_s=3600)
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    approval_id = (await _decide(h, runtime, refund_request()))["approval"]["id"]
    async with _signed_in(h, tenant) as client:
        clock.advance(milliseconds=61_000)
        page = (await client.get(f"/ui/approvals/{approval_id}")).text
        inbox = (await client.get("/ui")).text
        script = await client.get("/ui/static/countdown.js")
    for html in (page, inbox):
        assert ('<time class="countdown" datetime="2030-01-01T12:30:00.000000Z" '
                'data-expires="2030-01-01T12:30:00.000000Z" data-seconds-left="1739">'
                '28 min left</time>') in html
        assert "2030-01-01 12:30:00 UTC" in html  # the absolute expiry, without JavaScript
        assert '<script src="/ui/static/countdown.js" defer></script>' in html
        # no inline script anywhere: every script tag loads a file of this site
        assert all(re.fullmatch(r'<script src="/ui/static/[a-z]+\.js"( defer)?></script>', tag)
                   for tag in re.findall(r"<script.*?</script>", html, re.S))
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    csp = [d.strip() for d in script.headers["content-security-policy"].split(";")]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp


async def test_the_inbox_pages_past_100_in_a_stable_order_and_counts_all(
        harness: Any, tenant: str) -> None:
    ids = await _open_many(harness, tenant, 130)
    # Another tenant's pending requests never show, nor count (tenant isolation).
    other = await _open_many(harness, tenant + "-other", 30)
    async with _signed_in(harness, tenant) as client:
        pages, last = await _walk(client, "/ui?size=50")
        assert [len(p) for p in pages] == [50, 50, 30]
        seen = [i for p in pages for i in p]
        assert sorted(seen) == sorted(ids) and not set(seen) & set(other)
        assert "(130)" in last
        # Soonest expiry first, ties by id: one total, stable order across pages.
        async with harness.db.read() as conn:
            keys = (await conn.execute(select(approvals.c.id).where(
                approvals.c.tenant == tenant).order_by(approvals.c.expires_at,
                                                       approvals.c.id))).scalars().all()
        assert seen == list(keys)
        # Back from the last page gives the middle page again.
        back = await client.get(_link(_PREV, last) or "")
        assert _rows(back.text) == pages[1]
        # The size is bounded (10..200) and a forged cursor shows the first page.
        assert len(_rows((await client.get("/ui?size=100000")).text)) == 130
        assert len(_rows((await client.get("/ui?size=1")).text)) == 10
        assert _rows((await client.get("/ui?size=50&cursor=AAAA")).text) == pages[0]


async def test_the_inbox_sorts_by_tool_time_left_and_created(
        harness_factory: Any, tenant: str, tmp_path: Path) -> None:
    h = await harness_factory(bundle_dirs=[ROOT / "policies", review_bundle(tmp_path, tenant)])
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    made = []
    for i in range(3):
        body = message_request(body=f"m{i}") | {"run": {"id": f"run-{i}"}}
        made.append((await _decide(h, runtime, body))["approval"]["id"])
    async with _signed_in(h, tenant) as client:
        assert _rows((await client.get("/ui?sort=created&dir=desc")).text) == made[::-1]
        assert _rows((await client.get("/ui?sort=created&dir=asc")).text) == made
        assert _rows((await client.get("/ui?sort=expires")).text) == made
        html = (await client.get("/ui?sort=expires&dir=desc")).text
        assert _rows(html) == made[::-1]
        assert 'aria-sort="descending"><a href="/ui?size=50&amp;sort=expires&amp;dir=asc"' in html
        assert _rows((await client.get("/ui?sort=nonsense")).text) == made  # default order


async def test_the_history_filters_by_status_tool_and_day_and_pages_past_100(
        harness_factory: Any, tenant: str) -> None:
    clock = FrozenClock(datetime(2030, 1, 1, 12, tzinfo=UTC))
    h = await harness_factory(clock=clock, session_idle_timeout_s=7200)
    expired = await _open_many(h, tenant, 105)
    async with _signed_in(h, tenant) as client:
        clock.advance(milliseconds=1_800_000)  # all 105 expire at this instant
        runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
        rejected = (await _decide(h, runtime, refund_request(160_000) | {
            "run": {"id": "run-r"}}))["approval"]["id"]
        page = await client.get(f"/ui/approvals/{rejected}")
        assert rejected in (await client.get("/ui")).text  # the others expire now
        clock.advance(milliseconds=1000)
        await _review(client, rejected, page.text, "rejected", comment="no")
        pages, last = await _walk(client, "/ui/history?size=50")
        seen = [i for p in pages for i in p]
        assert sorted(seen) == sorted([*expired, rejected]) and "(106)" in last
        assert seen[0] == rejected  # the newest decision first
        only = (await client.get("/ui/history?status=rejected")).text
        assert _rows(only) == [rejected] and "(1)" in only
        assert 'value="rejected" selected' in only
        assert _rows((await client.get("/ui/history?tool=get_order")).text) == []
        assert len(_rows((await client.get("/ui/history?tool=issue_refund&size=200")).text)) == 106
        day = "2030-01-01"
        assert len(_rows((await client.get(f"/ui/history?since={day}&until={day}&size=200")
                          ).text)) == 106
        assert _rows((await client.get("/ui/history?since=2030-01-02")).text) == []
        assert _rows((await client.get("/ui/history?until=2029-12-31")).text) == []
        # Paging keeps the filters.
        paged = (await client.get("/ui/history?status=expired&size=10")).text
        assert "status=expired" in (_link(_NEXT, paged) or "")
        # The history shows amounts, formatted.
        assert "$1,600.00" in unescape(only)


async def test_a_revoked_permit_shows_as_approved_permit_revoked(harness: Any,
                                                                  tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime", subject="agent-runtime")
    approval_id = (await _decide(harness, runtime, refund_request()))["approval"]["id"]
    async with _signed_in(harness, tenant) as client:
        page = await client.get(f"/ui/approvals/{approval_id}")
        await _review(client, approval_id, page.text, "approved")
        approved = (await client.get(f"/ui/approvals/{approval_id}")).text
        assert 'id="permit"' in approved and "permit revoked" not in approved
        state = (await harness.client.get(f"/v1/approvals/{approval_id}",
                                          headers=runtime)).json()
        admin = await harness.headers(tenant, "admin", subject="ops")
        revoked = await harness.client.post(f"/v1/permits/{state['permit']['jti']}/revoke",
                                            headers=admin)
        assert revoked.status_code == 200, revoked.text
        detail = (await client.get(f"/ui/approvals/{approval_id}")).text
        history = (await client.get("/ui/history")).text
    assert "approved — permit revoked" in detail and 'id="permit-revoked"' in detail
    assert 'id="permit"' not in detail
    assert "approved — permit revoked" in history


async def test_the_run_panel_shows_the_runs_decisions_and_outcomes_masked(
        harness_factory: Any, tenant: str, tmp_path: Path) -> None:
    h = await harness_factory(bundle_dirs=[ROOT / "policies", review_bundle(tmp_path, tenant)])
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    run = {"id": f"run-{uuid.uuid4().hex[:6]}"}
    first = await _decide(h, runtime, message_request(card_number="4111111111111111",
                                                      body="first") | {"run": run})
    denied = await _decide(h, runtime, message_request() | {"run": run, "tool": {
        "name": "delete_account"}})
    assert denied["effect"] == "deny"
    outcome = await h.client.post(f"/v1/decisions/{denied['decision_id']}/outcome",
                                  headers=runtime,
                                  json={"outcome": "ok", "side_effect": "not_executed"})
    assert outcome.status_code == 200, outcome.text
    current = await _decide(h, runtime, message_request(body="second") | {"run": run})
    # Another run's decisions and another tenant's same run id stay out.
    await _decide(h, runtime, message_request(body="elsewhere") | {"run": {"id": "other"}})
    other = await h.headers(tenant + "-x", "runtime", subject="agent-runtime")
    await h.client.post("/v1/decisions", json=refund_request() | {"run": run}, headers=other)
    async with _signed_in(h, tenant) as client:
        html = (await client.get(f"/ui/approvals/{current['approval']['id']}")).text
    panel = unescape(html[html.index('id="run-panel"'):html.index("Your review")])
    assert "3 decisions in run" in panel and "elsewhere" not in panel
    rows = re.findall(r"<tr(?: class=\"current\" aria-current=\"true\")?>", panel)
    assert len(rows) == 4  # the header row and three decisions
    assert panel.index("first") < panel.index("delete_account") < panel.index("(this request)")
    assert "4111111111111111" not in html and "•••" in panel  # masked as in the log
    assert "not_executed" in panel and "deny" in panel
    assert f'href="/ui/approvals/{first["approval"]["id"]}"' in panel
    assert "issue_refund" not in panel


async def test_the_run_panel_is_bounded(harness_factory: Any, tenant: str) -> None:
    h = await harness_factory()
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    run = {"id": "long-run"}
    for start in range(0, 24, 8):
        await asyncio.gather(*(_decide(h, runtime, refund_request(1000 + i) | {"run": run})
                               for i in range(start, start + 8)))
    current = await _decide(h, runtime, refund_request(150_000) | {"run": run})
    async with _signed_in(h, tenant) as client:
        html = (await client.get(f"/ui/approvals/{current['approval']['id']}")).text
    assert "The latest 20 of 25 decisions" in html
    assert html.count("<tr>") + html.count('<tr class="current"') == 21  # header + 20


async def test_lists_are_tenant_scoped_for_readers_too(harness: Any, tenant: str) -> None:
    mine = await _open_many(harness, tenant, 3)
    theirs = await _open_many(harness, tenant + "-b", 3)
    async with _signed_in(harness, tenant, "olive", "admin") as client:
        inbox = (await client.get("/ui")).text
        history = (await client.get("/ui/history")).text
        for approval_id in theirs:
            assert (await client.get(f"/ui/approvals/{approval_id}")).status_code == 404
    assert sorted(_rows(inbox)) == sorted(mine) and "(3)" in inbox
    assert _rows(history) == [] and "(0)" in history
    assert not any(i in inbox + history for i in theirs)



async def test_a_page_reads_a_bounded_number_of_rows_and_goes_on_from_there(
        harness: Any, tenant: str, monkeypatch: Any) -> None:
    """Requests the approver may not review (here: her own) are skipped; past MAX_SCAN
    rows read, the page ends short with a Next link that resumes after them."""
    from cosigner.approvals import listing

    monkeypatch.setattr(listing, "MAX_SCAN", 50)
    runtime = await harness.headers(tenant, "runtime", subject="agent-runtime")
    own = {"initiator": {"id": "fiona", "type": "user"}}
    for start in range(0, 55, 11):
        await asyncio.gather(*(_decide(harness, runtime, refund_request(150_000 + i) | own
                                       | {"run": {"id": f"own-{i}"}})
                               for i in range(start, start + 11)))
    reviewable = await _open_many(harness, tenant, 5)  # these expire last
    async with _signed_in(harness, tenant) as client:
        first = (await client.get("/ui?size=10")).text
        assert _rows(first) == [] and "(5)" in first and "go on with the next page" in first
        nxt = _link(_NEXT, first)
        assert nxt is not None
        second = (await client.get(nxt)).text
    assert sorted(_rows(second)) == sorted(reviewable)



async def test_the_last_day_of_the_calendar_is_a_valid_until(harness: Any, tenant: str) -> None:
    async with _signed_in(harness, tenant, "olive", "admin") as client:
        for path in ("/ui/history?until=9999-12-31",
                     "/ui/history?since=0001-01-01&until=0001-01-01"):
            response = await client.get(path)
            assert response.status_code == 200, (path, response.text[:300])


async def test_forged_cursors_are_read_leniently(harness: Any, tenant: str) -> None:
    import base64
    import json

    def cursor(sort: str, desc: bool, value: str) -> str:
        raw = json.dumps({"s": sort, "d": desc, "v": value, "i": "z", "b": False}).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    mine = await _open_many(harness, tenant, 2)
    async with _signed_in(harness, tenant, "olive", "admin") as client:
        # Out of the database's range once in UTC: not "the database is unavailable" (503).
        for path in ("/ui?cursor=" + cursor("expires", False, "0001-01-01T00:00:00+05:00"),
                     "/ui?cursor=" + cursor("created", True, "9999-12-31T23:59:59-05:00"),
                     "/ui/history?cursor=" + cursor("decided", True, "2026-01-01")):
            response = await client.get(path)
            assert response.status_code == 200, (path, response.text[:300])
        inbox = (await client.get("/ui?cursor=" + cursor("expires", False,
                                                         "2000-01-01T00:00:00"))).text
    assert sorted(_rows(inbox)) == sorted(mine)  # a naive time is read as UTC
