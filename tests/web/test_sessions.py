"""Sign-in, sessions, CSRF, security headers and sign-in throttling, over HTTP (no browser)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from cosigner.core.clock import FrozenClock
from cosigner.db.tables import api_keys, principals
from cosigner.db.tables_web import web_sessions
from cosigner.identity import accounts
from cosigner.web import csrf, sessions
from tests.web.conftest import PASSWORD, add_user, csrf_of, sign_in, web_client


def _client(h: Any) -> httpx.AsyncClient:
    return web_client(h)


async def test_sign_in_sets_strict_httponly_cookie_and_opens_inbox(harness: Any,
                                                                   tenant: str) -> None:
    await add_user(harness.db, tenant, "alice", "finance")
    async with _client(harness) as client:
        response = await sign_in(client, tenant, "alice")
        assert response.status_code == 303 and response.headers["location"] == "/ui"
        cookie = next(v for k, v in response.headers.multi_items()
                      if k == "set-cookie" and v.startswith(sessions.COOKIE + "="))
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
        assert "Secure" not in cookie  # plain http here; https sets Secure
        inbox = await client.get("/ui")
        assert inbox.status_code == 200 and "alice" in inbox.text


async def test_session_cookie_is_secure_over_https(harness_factory: Any, tenant: str) -> None:
    h = await harness_factory(public_url="https://cosigner.example")
    await add_user(h.db, tenant, "alice", "finance")
    async with web_client(h, "https://cosigner.example") as client:
        response = await sign_in(client, tenant, "alice")
        cookie = next(v for k, v in response.headers.multi_items()
                      if k == "set-cookie" and v.startswith(sessions.COOKIE + "="))
        assert "Secure" in cookie


async def test_only_the_hash_of_the_session_id_is_stored(harness: Any, tenant: str) -> None:
    await add_user(harness.db, tenant, "alice", "finance")
    async with _client(harness) as client:
        await sign_in(client, tenant, "alice")
        raw = client.cookies[sessions.COOKIE]
    async with harness.db.read() as conn:
        stored = (await conn.execute(select(web_sessions.c.id_hash).where(
            web_sessions.c.tenant == tenant))).scalars().all()
    assert raw not in stored and len(stored) == 1 and len(stored[0]) == 64


async def test_session_id_is_rotated_at_sign_in(harness: Any, tenant: str) -> None:
    await add_user(harness.db, tenant, "alice", "finance")
    async with _client(harness) as client:
        await sign_in(client, tenant, "alice")
        first = client.cookies[sessions.COOKIE]
        await client.get("/ui/login")  # already signed in: redirected
        client.cookies.delete(sessions.COOKIE)
        client.cookies.set(sessions.COOKIE, first, domain="cosigner.test", path="/ui")
        form = await client.get("/ui/login", follow_redirects=False)
        assert form.status_code == 303  # still signed in
    async with _client(harness) as client:
        client.cookies.set(sessions.COOKIE, first, domain="cosigner.test", path="/ui")
        client.cookies.set(sessions.PRE_COOKIE, "pre-value", domain="cosigner.test", path="/ui")
        response = await client.post("/ui/login", data={
            "tenant": tenant, "name": "alice", "password": PASSWORD,
            "csrf_token": csrf.token_for("pre-value")})
        assert response.status_code == 303
        second = client.cookies[sessions.COOKIE]
        assert second != first
    async with _client(harness) as client:  # the old id no longer works
        client.cookies.set(sessions.COOKIE, first, domain="cosigner.test", path="/ui")
        assert (await client.get("/ui")).status_code == 303


async def test_wrong_password_and_unknown_user_get_the_same_answer(harness: Any,
                                                                   tenant: str) -> None:
    await add_user(harness.db, tenant, "alice", "finance")
    async with _client(harness) as client:
        wrong = await sign_in(client, tenant, "alice", password="not the password!")
        unknown = await sign_in(client, tenant, "mallory", password="not the password!")
    assert wrong.status_code == unknown.status_code == 401
    assert "Wrong name or password." in wrong.text and "Wrong name or password." in unknown.text
    assert sessions.COOKIE not in wrong.cookies


async def test_login_without_csrf_token_is_refused(harness: Any, tenant: str) -> None:
    await add_user(harness.db, tenant, "alice", "finance")
    async with _client(harness) as client:
        await client.get("/ui/login")
        response = await client.post("/ui/login", data={
            "tenant": tenant, "name": "alice", "password": PASSWORD})
        assert response.status_code == 403
        assert sessions.COOKIE not in client.cookies


async def test_idle_session_expires(harness_factory: Any, tenant: str) -> None:
    clock = FrozenClock(datetime(2030, 1, 1, tzinfo=UTC))
    h = await harness_factory(clock=clock, session_idle_timeout_s=600)
    await add_user(h.db, tenant, "alice", "finance", clock=clock)
    async with _client(h) as client:
        await sign_in(client, tenant, "alice")
        clock.advance(seconds=599)
        assert (await client.get("/ui")).status_code == 200  # activity moves the deadline
        clock.advance(seconds=599)
        assert (await client.get("/ui")).status_code == 200
        clock.advance(seconds=600)
        response = await client.get("/ui")
        assert response.status_code == 303
        assert response.headers["location"].startswith("/ui/login")


async def test_sign_out_ends_the_session(harness: Any, tenant: str) -> None:
    await add_user(harness.db, tenant, "alice", "finance")
    async with _client(harness) as client:
        await sign_in(client, tenant, "alice")
        raw = client.cookies[sessions.COOKIE]
        page = await client.get("/ui")
        assert (await client.post("/ui/logout", data={})).status_code == 403  # no token
        response = await client.post("/ui/logout", data={"csrf_token": csrf_of(page.text)})
        assert response.status_code == 303
    async with _client(harness) as client:
        client.cookies.set(sessions.COOKIE, raw, domain="cosigner.test", path="/ui")
        assert (await client.get("/ui")).status_code == 303


async def test_disable_ends_sessions_and_revokes_api_keys(harness: Any, tenant: str) -> None:
    await add_user(harness.db, tenant, "alice", "finance")
    await harness.key(tenant, "runtime", subject="alice")
    async with _client(harness) as client:
        await sign_in(client, tenant, "alice")
        ended = await accounts.disable_principal(harness.db, tenant=tenant, name="alice",
                                                 clock=harness.context.clock)
        assert ended == {"sessions": 1, "api_keys": 1}
        assert (await client.get("/ui")).status_code == 303
        again = await sign_in(client, tenant, "alice")
        assert again.status_code == 401
    async with harness.db.read() as conn:
        revoked = (await conn.execute(
            select(api_keys.c.revoked_at).join(principals).where(
                principals.c.tenant == tenant))).scalars().all()
    assert revoked and all(r is not None for r in revoked)


async def test_security_headers_on_every_ui_response(harness: Any, tenant: str) -> None:
    await add_user(harness.db, tenant, "alice", "finance")
    async with _client(harness) as client:
        responses = [await client.get("/ui/login"), await client.get("/ui"),
                     await client.get("/ui/static/style.css"),
                     await client.post("/ui/logout", data={})]
        await sign_in(client, tenant, "alice")
        responses += [await client.get("/ui"), await client.get("/ui/history"),
                      await client.get("/ui/approvals/does-not-exist")]
    for response in responses:
        csp = response.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "form-action 'self'" in csp
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "same-origin"


async def test_pages_have_no_inline_script_or_style(harness: Any, tenant: str) -> None:
    await add_user(harness.db, tenant, "alice", "finance")
    async with _client(harness) as client:
        await sign_in(client, tenant, "alice")
        for path in ("/ui", "/ui/history"):
            html = (await client.get(path)).text
            # Scripts only by same-origin src, with no body (CSP script-src 'self').
            scripts = re.findall(r"<script[^>]*>[^<]*</script>", html)
            assert len(scripts) == html.count("<script") and scripts
            assert all(re.fullmatch(r'<script src="/ui/static/[a-z0-9_-]+\.js" defer>'
                                    r"</script>", tag) for tag in scripts), scripts
            assert "style=" not in html and "<style" not in html


async def test_signin_is_throttled_per_account(harness_factory: Any, tenant: str) -> None:
    h = await harness_factory(signin_account_limit=3, signin_address_limit=100)
    await add_user(h.db, tenant, "alice", "finance")
    async with _client(h) as client:
        for _ in range(3):
            assert (await sign_in(client, tenant, "alice", "wrong password!!")).status_code == 401
        locked = await sign_in(client, tenant, "alice")  # right password, but locked
        assert locked.status_code == 429 and "Too many failed sign-ins" in locked.text
        other = await add_user(h.db, tenant, "bob", "finance")
        assert other
        assert (await sign_in(client, tenant, "bob")).status_code == 303


async def test_signin_is_throttled_per_address(harness_factory: Any, tenant: str) -> None:
    h = await harness_factory(signin_account_limit=3, signin_address_limit=4)
    await add_user(h.db, tenant, "alice", "finance")
    async with _client(h) as client:
        for name in ("u1", "u2", "u3", "u4"):  # spraying different names
            assert (await sign_in(client, tenant, name, "guess guess guess")).status_code == 401
        assert (await sign_in(client, tenant, "alice")).status_code == 429


async def test_throttle_lifts_after_lockout(harness_factory: Any, tenant: str) -> None:
    clock = FrozenClock(datetime(2030, 1, 1, tzinfo=UTC))
    h = await harness_factory(clock=clock)
    limits = accounts.SigninLimits(account=2, address=100, window_s=60, lockout_s=300)
    await add_user(h.db, tenant, "alice", "finance", clock=clock)
    for _ in range(2):
        with pytest.raises(accounts.Unauthenticated):
            await accounts.authenticate_password(h.db, tenant=tenant, name="alice",
                                                 password="nope nope nope", address="1.2.3.4",
                                                 clock=clock, limits=limits)
    with pytest.raises(accounts.Unauthenticated) as locked:
        await accounts.authenticate_password(h.db, tenant=tenant, name="alice",
                                             password=PASSWORD, address="1.2.3.4",
                                             clock=clock, limits=limits)
    assert locked.value.code == "signin_throttled"
    clock.advance(seconds=300)
    caller = await accounts.authenticate_password(h.db, tenant=tenant, name="alice",
                                                  password=PASSWORD, address="1.2.3.4",
                                                  clock=clock, limits=limits)
    assert caller.subject == "alice" and caller.kind == "user"


async def test_short_password_is_refused(harness: Any, tenant: str) -> None:
    with pytest.raises(accounts.InvalidRequest):
        await add_user(harness.db, tenant, "alice", "finance", password="short")


async def test_sessions_nobody_came_back_to_are_deleted_at_the_next_sign_in(
        harness_factory: Any, tenant: str) -> None:
    clock = FrozenClock(datetime(2030, 1, 1, tzinfo=UTC))
    h = await harness_factory(clock=clock, session_idle_timeout_s=600)
    await add_user(h.db, tenant, "alice", "finance", clock=clock)
    for _ in range(3):
        async with _client(h) as client:  # a new browser each time, never signing out
            await sign_in(client, tenant, "alice")
        clock.advance(seconds=601)
    async with h.db.read() as conn:
        rows = (await conn.execute(select(web_sessions.c.id_hash).where(
            web_sessions.c.tenant == tenant))).all()
    assert len(rows) == 1


async def test_a_session_in_use_still_ends_at_its_maximum_age(harness_factory: Any,
                                                              tenant: str) -> None:
    """Activity keeps a session from idling out, but not forever: roles a single sign-on
    gave (or a password since switched off) must be re-confirmed at a fresh sign-in."""
    clock = FrozenClock(datetime(2030, 1, 1, tzinfo=UTC))
    h = await harness_factory(clock=clock, session_idle_timeout_s=600,
                              session_max_age_s=3600)
    await add_user(h.db, tenant, "alice", "finance", clock=clock)
    async with _client(h) as client:
        await sign_in(client, tenant, "alice")
        for _ in range(6):  # 3594 s, never idle
            clock.advance(seconds=599)
            assert (await client.get("/ui")).status_code == 200
        clock.advance(seconds=6)
        response = await client.get("/ui")
        assert response.status_code == 303
        assert response.headers["location"].startswith("/ui/login")
