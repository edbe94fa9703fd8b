"""The single sign-on pages over HTTP (no browser, no provider): what the sign-in page
offers per tenant, passwords switched off, and the refusals that need no provider."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from cosigner.db.tables import audit_events
from tests.conftest import Harness, free_port
from tests.web.conftest import add_user, sign_in, web_client


def provider(**overrides: Any) -> dict[str, Any]:
    # Nothing listens on this port: discovery fails.
    return {"issuer": f"http://127.0.0.1:{free_port()}", "client_id": "cosigner",
            "client_secret": "s3cret", "role_map": {"fin": ["finance"]},
            "label": "Acme SSO", **overrides}


@pytest.fixture
async def h(harness_factory: Callable[..., Any], tenant: str) -> Harness:
    harness: Harness = await harness_factory(oidc={
        tenant: provider(), f"{tenant}-only": provider(allow_passwords=False)})
    return harness


async def test_the_sign_in_page_offers_what_the_tenant_allows(h: Harness, tenant: str) -> None:
    async with web_client(h) as client:
        both = (await client.get(f"/ui/login?tenant={tenant}&next=/ui/history")).text
        assert f'href="/ui/oidc/start?tenant={tenant}&amp;next=%2Fui%2Fhistory"' in both
        assert "Sign in with Acme SSO" in both and 'id="password-form"' in both
        only = (await client.get(f"/ui/login?tenant={tenant}-only")).text
        assert 'id="sso"' in only and 'id="password-form"' not in only
        unknown = (await client.get("/ui/login")).text
        assert 'id="sso-tenant"' in unknown and 'id="password-form"' in unknown


async def test_passwords_switched_off_refuse_even_the_right_password(h: Harness,
                                                                      tenant: str) -> None:
    await add_user(h.db, f"{tenant}-only", "paula", "finance")
    await add_user(h.db, tenant, "paula", "finance")
    async with web_client(h) as client:
        refused = await sign_in(client, f"{tenant}-only", "paula")
        assert refused.status_code == 403 and "single sign-on only" in refused.text
        assert 'id="password-form"' not in refused.text
    async with web_client(h) as client:
        assert (await sign_in(client, tenant, "paula")).status_code == 303


async def test_refusals_without_the_provider_write_nothing_to_the_log(h: Harness,
                                                                       tenant: str) -> None:
    async with web_client(h) as client:
        page = await client.get("/ui/oidc/start?tenant=nobody")
        assert page.status_code == 404 and "oidc_not_configured" in page.text
        page = await client.get(f"/ui/oidc/start?tenant={tenant}")  # provider unreachable
        assert page.status_code == 502 and "oidc_unavailable" in page.text
        page = await client.get(f"/ui/oidc/start?tenant={tenant}&step_up=1&acr_values=a%0Ab")
        assert page.status_code == 422 and "oidc_bad_request" in page.text
        page = await client.get("/ui/oidc/callback?state=made-up&code=x")
        assert page.status_code == 400 and "oidc_state_invalid" in page.text
        assert "Nothing was signed in" in page.text
    async with h.db.read() as conn:
        count = (await conn.execute(select(func.count()).select_from(audit_events).where(
            audit_events.c.tenant == tenant))).scalar_one()
    assert count == 0


async def test_a_password_name_may_not_claim_a_single_sign_on_subject(h: Harness,
                                                                       tenant: str) -> None:
    from cosigner.core.errors import InvalidRequest

    with pytest.raises(InvalidRequest):
        await add_user(h.db, tenant, "oidc:https://idp.example#alice", "finance")


async def test_a_password_session_ends_once_passwords_are_switched_off(h: Harness,
                                                                        tenant: str) -> None:
    """A session a password started before the tenant went single-sign-on-only (the
    setting changed at a restart; sessions live in the database) must not go on acting:
    an active session never idles out, so it would keep a switched-off password alive."""
    from cosigner.identity.principals import PASSWORD_AUTHN, Caller
    from cosigner.web import sessions

    only = f"{tenant}-only"
    principal_id = await add_user(h.db, only, "paula", "finance")
    caller = Caller(tenant=only, principal_id=principal_id, subject="paula",
                    roles=frozenset({"finance"}), kind="user", authn=PASSWORD_AUTHN)
    raw = await sessions.create(h.db, caller, now=h.context.clock())
    async with web_client(h) as client:
        client.cookies.set(sessions.COOKIE, raw, domain="cosigner.test", path="/ui")
        inbox = await client.get("/ui")
        assert inbox.status_code == 303 and inbox.headers["location"].startswith("/ui/login")
    # The session is gone for good, not just hidden.
    assert await sessions.load(h.db, raw, now=h.context.clock(), idle_timeout_s=3600) is None


async def test_a_long_next_is_not_a_server_error(harness_factory: Callable[..., Any],
                                                  tenant: str) -> None:
    """Anyone may open /ui/oidc/start: a ``next`` longer than the pending sign-in's column
    (512) must not fail the insert (a 500 on PostgreSQL); it falls back to /ui."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from urllib.parse import parse_qs, urlsplit

    from cosigner.db.tables_web import oidc_logins

    port = free_port()
    issuer = f"http://127.0.0.1:{port}"

    class Discovery(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"issuer": issuer, "authorization_endpoint": issuer + "/auth",
                               "token_endpoint": issuer + "/token",
                               "jwks_uri": issuer + "/jwks"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", port), Discovery)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        h = await harness_factory(oidc={tenant: provider(issuer=issuer)})
        async with web_client(h) as client:
            started = await client.get(f"/ui/oidc/start?tenant={tenant}&next=/ui/"
                                       + "a" * 600)
        assert started.status_code == 303, started.text[:300]
        state = parse_qs(urlsplit(started.headers["location"]).query)["state"][0]
        assert started.headers["location"].startswith(issuer + "/auth?") and state
        async with h.db.read() as conn:
            stored = (await conn.execute(select(oidc_logins.c.next_path).where(
                oidc_logins.c.tenant == tenant))).scalars().all()
        assert stored == ["/ui"]
    finally:
        server.shutdown()
        thread.join()


class _Discovery:
    """A provider's discovery document on loopback (enough for ``/ui/oidc/start``)."""

    def __init__(self) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.issuer = f"http://127.0.0.1:{free_port()}"
        issuer = self.issuer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = json.dumps({
                    "issuer": issuer, "authorization_endpoint": issuer + "/auth",
                    "token_endpoint": issuer + "/token", "jwks_uri": issuer + "/jwks",
                    "id_token_signing_alg_values_supported": ["RS256"]}).encode()
                found = self.path == "/.well-known/openid-configuration"
                self.send_response(200 if found else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", int(issuer.rsplit(":", 1)[1])),
                                          Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_unfinished_sign_ins_per_address_are_bounded(
        harness_factory: Callable[..., Any], tenant: str) -> None:
    """Anyone may start a single sign-on, and each start stores a pending row: one client
    address gets ``oidc_pending_per_address_max`` unfinished ones within their lifetime,
    then a 429 page with ``Retry-After``; other addresses are not affected, and expired
    ones free the address again."""
    from datetime import UTC, datetime

    from cosigner.core.clock import FrozenClock
    from cosigner.db.tables_web import oidc_logins

    idp = _Discovery()
    try:
        clock = FrozenClock(datetime.now(UTC))
        h = await harness_factory(clock=clock, oidc={tenant: provider(issuer=idp.issuer)},
                                  oidc_pending_per_address_max=3, oidc_login_ttl_s=600)

        async def pending() -> int:
            async with h.db.read() as conn:
                return int((await conn.execute(select(func.count()).select_from(
                    oidc_logins).where(oidc_logins.c.tenant == tenant))).scalar_one())

        async with web_client(h) as one, web_client(h) as other:
            for _ in range(3):
                started = await one.get(f"/ui/oidc/start?tenant={tenant}")
                assert started.status_code == 303, started.text
                assert started.headers["location"].startswith(idp.issuer + "/auth?")
                one.cookies.clear()  # a script keeping no cookies: still one address
            busy = await one.get(f"/ui/oidc/start?tenant={tenant}")
            assert busy.status_code == 429, busy.text
            assert "oidc_too_many_pending" in busy.text and "Too many sign-ins" in busy.text
            assert 590 <= int(busy.headers["retry-after"]) <= 600
            assert await pending() == 3
            assert (await other.get(f"/ui/oidc/start?tenant={tenant}")).status_code == 303
            assert await pending() == 4
            clock.advance(seconds=601)  # the first three expired: the address may start again
            assert (await one.get(f"/ui/oidc/start?tenant={tenant}")).status_code == 303
    finally:
        idp.stop()
