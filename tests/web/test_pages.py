"""The approver pages over HTTP (no browser): what they show, and every way a review
through the form is refused. The rules themselves live in ``cosigner.approvals.reviews.review``."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from html import unescape
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from cosigner.core.canonical import args_hash, canonicalize
from cosigner.core.clock import FrozenClock
from cosigner.db.tables_approvals import approvals, reviews
from cosigner.web import views
from tests.conftest import ROOT
from tests.web.conftest import (
    add_user,
    csrf_of,
    message_request,
    permit_claims,
    refund_request,
    review_bundle,
    sign_in,
    web_client,
)


def _client(h: Any) -> httpx.AsyncClient:
    return web_client(h)


async def _pending(h: Any, tenant: str, body: dict[str, Any] | None = None
                   ) -> tuple[str, dict[str, str], dict[str, Any]]:
    """Open a refund approval; returns (approval id, runtime headers, the request body)."""
    runtime = await h.headers(tenant, "runtime", subject="agent-runtime")
    body = body or refund_request()
    decision = (await h.client.post("/v1/decisions", json=body, headers=runtime)).json()
    assert decision["effect"] == "require_approval", decision
    return decision["approval"]["id"], runtime, body


def _shown_hash(html: str) -> str:
    match = re.search(r'id="args-hash">([^<]+)<', html)
    assert match
    return match.group(1)


def _shown_args(html: str) -> str:
    match = re.search(r'<pre class="args" id="args">(.*?)</pre>', html, re.S)
    assert match
    return unescape(match.group(1))


async def _status(h: Any, approval_id: str) -> str:
    async with h.db.read() as conn:
        return str((await conn.execute(select(approvals.c.status).where(
            approvals.c.id == approval_id))).scalar_one())


async def test_K07_hash_shown_is_hash_in_permit_is_hash_redeemed(harness: Any,
                                                                  tenant: str) -> None:
    body = refund_request()
    approval_id, runtime, body = await _pending(harness, tenant, body)
    await add_user(harness.db, tenant, "fiona", "finance")
    async with _client(harness) as client:
        await sign_in(client, tenant, "fiona")
        inbox = await client.get("/ui")
        assert approval_id in inbox.text and "issue_refund" in inbox.text
        page = await client.get(f"/ui/approvals/{approval_id}")
        shown = _shown_hash(page.text)
        # The page shows the canonical text itself (indented): strip the layout, get the bytes.
        assert _shown_args(page.text) == views.pretty_canonical(body["args"])
        assert args_hash(body["args"]) == shown
        posted = await client.post(f"/ui/approvals/{approval_id}/review", data={
            "decision": "approved", "comment": "ok", "args_hash": shown,
            "csrf_token": csrf_of(page.text)})
        assert posted.status_code == 303
        done = await client.get(posted.headers["location"])
        assert "You approved this request." in done.text and 'id="permit"' in done.text
    state = (await harness.client.get(f"/v1/approvals/{approval_id}", headers=runtime)).json()
    assert state["status"] == "approved"
    token = state["permit"]["token"]
    assert permit_claims(token)["args_hash"] == shown
    redeemed = await harness.client.post("/v1/permits/redeem", headers=runtime, json={
        "permit": token, "tool": "issue_refund", "args": body["args"]})
    assert redeemed.status_code == 200, redeemed.text
    mutated = {**body["args"], "amount_minor": body["args"]["amount_minor"] + 1}
    assert args_hash(mutated) != shown


async def test_pretty_arguments_are_the_canonical_bytes() -> None:
    value = {"b": [1, 2.5, {"z": None}], "a": "x, {y}: \"q\"", "c": 1e-7, "é": 1e21}
    pretty = views.pretty_canonical(value)
    compact = re.sub(r'("(?:[^"\\]|\\.)*")|\s+', lambda m: m.group(1) or "", pretty)
    assert compact.encode() == canonicalize(value)


async def test_inbox_lists_amount_first_and_who_asked(harness: Any, tenant: str) -> None:
    approval_id, _, _ = await _pending(harness, tenant)
    await add_user(harness.db, tenant, "fiona", "finance")
    async with _client(harness) as client:
        await sign_in(client, tenant, "fiona")
        html = (await client.get("/ui", headers={"Accept-Language": "en-US"})).text
    item = html[html.index(approval_id):]
    # The catalogue marks amount_minor as money in minor units of /currency (150000 USD).
    assert item.index("Amount") < item.index("$1,500.00") < item.index("order_id")
    assert "agent-support (agent)" in item and "customer-42 (customer)" in item
    assert "min left" in item


async def test_reject_needs_a_comment_and_is_recorded(harness: Any, tenant: str) -> None:
    approval_id, _, _ = await _pending(harness, tenant)
    await add_user(harness.db, tenant, "fiona", "finance")
    async with _client(harness) as client:
        await sign_in(client, tenant, "fiona")
        page = await client.get(f"/ui/approvals/{approval_id}")
        form = {"decision": "rejected", "comment": "  ", "args_hash": _shown_hash(page.text),
                "csrf_token": csrf_of(page.text)}
        empty = await client.post(f"/ui/approvals/{approval_id}/review", data=form)
        assert empty.status_code == 422 and "comment is required" in empty.text
        assert await _status(harness, approval_id) == "pending"
        form["comment"] = "duplicate of ord_8471"
        assert (await client.post(f"/ui/approvals/{approval_id}/review",
                                  data=form)).status_code == 303
        history = (await client.get("/ui/history")).text
    assert await _status(harness, approval_id) == "rejected"
    assert "fiona" in history and "duplicate of ord_8471" in history and "rejected" in history


async def test_K13_initiator_cannot_approve_through_the_form(harness: Any, tenant: str) -> None:
    approval_id, _, _ = await _pending(harness, tenant)
    # The user is the initiator ("agent-support") and holds finance as well.
    await add_user(harness.db, tenant, "agent-support", "finance", "runtime")
    async with _client(harness) as client:
        await sign_in(client, tenant, "agent-support")
        page = await client.get(f"/ui/approvals/{approval_id}")
        response = await client.post(f"/ui/approvals/{approval_id}/review", data={
            "decision": "approved", "requested_by": "someone-else", "approver": "fiona",
            "args_hash": _shown_hash(page.text), "csrf_token": csrf_of(page.text)})
    assert response.status_code == 409
    assert "You cannot approve a request you initiated" in response.text
    assert await _status(harness, approval_id) == "pending"


async def test_K15_user_without_the_role_is_refused(harness: Any, tenant: str) -> None:
    approval_id, _, _ = await _pending(harness, tenant)
    await add_user(harness.db, tenant, "sam", "security")
    async with _client(harness) as client:
        await sign_in(client, tenant, "sam")
        assert approval_id not in (await client.get("/ui")).text
        assert (await client.get(f"/ui/approvals/{approval_id}")).status_code == 403
        form_page = await client.get("/ui")
        response = await client.post(f"/ui/approvals/{approval_id}/review", data={
            "decision": "approved", "args_hash": "x", "csrf_token": csrf_of(form_page.text)})
    assert response.status_code == 403
    assert await _status(harness, approval_id) == "pending"


async def test_post_without_or_with_another_sessions_csrf_token_changes_nothing(
        harness: Any, tenant: str) -> None:
    approval_id, _, _ = await _pending(harness, tenant)
    await add_user(harness.db, tenant, "fiona", "finance")
    await add_user(harness.db, tenant, "frank", "finance")
    async with _client(harness) as other:
        await sign_in(other, tenant, "frank")
        foreign = csrf_of((await other.get("/ui")).text)
    async with _client(harness) as client:
        await sign_in(client, tenant, "fiona")
        page = await client.get(f"/ui/approvals/{approval_id}")
        base = {"decision": "approved", "args_hash": _shown_hash(page.text)}
        for extra in ({}, {"csrf_token": ""}, {"csrf_token": foreign},
                      {"csrf_token": "0" * 64}):
            response = await client.post(f"/ui/approvals/{approval_id}/review",
                                         data={**base, **extra})
            assert response.status_code == 403
        # State changes only by POST: a GET on the review URL does nothing.
        assert (await client.get(f"/ui/approvals/{approval_id}/review")).status_code == 405
    async with _client(harness) as anonymous:
        response = await anonymous.post(f"/ui/approvals/{approval_id}/review", data=base)
        assert response.status_code == 403
    assert await _status(harness, approval_id) == "pending"
    async with harness.db.read() as conn:
        assert (await conn.execute(select(reviews).where(
            reviews.c.approval_id == approval_id))).first() is None


async def test_args_with_markup_render_as_text_and_masked_paths_never_show(
        harness_factory: Any, tenant: str, tmp_path: Path) -> None:
    h = await harness_factory(bundle_dirs=[ROOT / "policies", review_bundle(tmp_path, tenant)])
    payload = '<script>alert(1)</script>" onmouseover="alert(2)'
    approval_id, _, _ = await _pending(h, tenant, message_request(
        body=payload, card_number="4111111111111111"))
    await add_user(h.db, tenant, "fiona", "finance")
    async with _client(h) as client:
        await sign_in(client, tenant, "fiona")
        for path in ("/ui", f"/ui/approvals/{approval_id}", "/ui/history"):
            html = (await client.get(path)).text
            assert "<script>alert(1)" not in html and '" onmouseover="' not in html
            assert "4111111111111111" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html or path == "/ui/history"
        detail = (await client.get(f"/ui/approvals/{approval_id}")).text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in detail
        assert '"card_number": "•••"' in unescape(detail)


async def test_K18_approve_at_the_expiry_instant_is_refused(harness_factory: Any,
                                                             tenant: str) -> None:
    clock = FrozenClock(datetime(2030, 1, 1, 12, tzinfo=UTC))
    h = await harness_factory(clock=clock, session_idle_timeout_s=3600)
    approval_id, _, _ = await _pending(h, tenant)
    await add_user(h.db, tenant, "fiona", "finance", clock=clock)
    async with _client(h) as client:
        await sign_in(client, tenant, "fiona")
        page = await client.get(f"/ui/approvals/{approval_id}")
        assert "30 min left" in page.text
        clock.advance(milliseconds=1_800_000)  # exactly expires_at
        response = await client.post(f"/ui/approvals/{approval_id}/review", data={
            "decision": "approved", "args_hash": _shown_hash(page.text),
            "csrf_token": csrf_of(page.text)})
    assert response.status_code == 409 and "has expired" in response.text
    assert 'id="approve"' not in response.text
    assert await _status(h, approval_id) == "expired"


async def test_another_tenants_request_is_not_found(harness: Any, tenant: str) -> None:
    approval_id, _, _ = await _pending(harness, tenant)
    await add_user(harness.db, tenant + "-b", "fiona", "finance")
    async with _client(harness) as client:
        await sign_in(client, tenant + "-b", "fiona")
        assert (await client.get(f"/ui/approvals/{approval_id}")).status_code == 404
        page = await client.get("/ui")
        response = await client.post(f"/ui/approvals/{approval_id}/review", data={
            "decision": "approved", "args_hash": "x", "csrf_token": csrf_of(page.text)})
        assert response.status_code == 404
    assert await _status(harness, approval_id) == "pending"
