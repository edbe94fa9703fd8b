"""Sign-in limits against live ``cosigner serve`` processes: whose ``X-Forwarded-For`` counts
(issue 13, fault 4), and that the per-address and per-name limits stay apart.

Clients connect from chosen loopback addresses (all of 127.0.0.0/8 reaches the server), so
the TCP peer the server sees is known. ``PROXY`` (127.0.0.1) plays the reverse proxy: it is
what uvicorn trusted by default, and what ``--forwarded-allow-ips 127.0.0.1`` trusts.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import delete

from cosigner.core.clock import FrozenClock, system_clock
from cosigner.db.database import Database
from cosigner.db.tables_web import signin_failures
from cosigner.identity import accounts
from tests.conftest import ROOT, LiveServer, start_module_server
from tests.web.conftest import PASSWORD, add_user, csrf_of

PROXY = "127.0.0.1"
ACCOUNT_LIMIT, ADDRESS_LIMIT = 3, 5
LIMITS = {"COSIGNER_SIGNIN_ACCOUNT_LIMIT": str(ACCOUNT_LIMIT),
          "COSIGNER_SIGNIN_ADDRESS_LIMIT": str(ADDRESS_LIMIT)}
_peers = itertools.count(2)


def _peer() -> str:
    """A loopback address no other test of this run uses."""
    n = next(_peers)
    return f"127.0.{n // 250 + 10}.{n % 250 + 2}"


def _documentation_address() -> str:
    """A random documentation address (2001:db8::/32), as a proxy would forward it;
    random because PostgreSQL, and so the counters, are shared by the whole run."""
    return f"2001:db8::{uuid.uuid4().hex[:4]}:{uuid.uuid4().hex[:4]}"


def _serve(folder: Path, db_kind: str, pg_url: str | None, sqlite_template: Path,
           *args: str) -> tuple[LiveServer, str]:
    return start_module_server(folder, db_kind=db_kind, pg_url=pg_url,
                               sqlite_template=sqlite_template,
                               bundle_dirs=[ROOT / "policies"], args=args, **LIMITS)


@pytest.fixture(scope="module")
def plain(db_kind: str, pg_url: str | None, sqlite_template: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, str]]:
    """``cosigner serve`` with the default: no proxy trusted."""
    live, url = _serve(tmp_path_factory.mktemp("plain"), db_kind, pg_url, sqlite_template)
    yield live, url
    live.stop()


@pytest.fixture(scope="module")
def proxied(db_kind: str, pg_url: str | None, sqlite_template: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, str]]:
    """``cosigner serve --forwarded-allow-ips 127.0.0.1``."""
    live, url = _serve(tmp_path_factory.mktemp("proxied"), db_kind, pg_url, sqlite_template,
                       "--forwarded-allow-ips", PROXY)
    yield live, url
    live.stop()


async def _user(database_url: str, tenant: str, name: str) -> None:
    db = Database(database_url)
    try:
        await add_user(db, tenant, name, "finance")
    finally:
        await db.dispose()


class Browser:
    """One sign-in form user connecting from ``peer`` (optionally through the proxy)."""

    def __init__(self, server: LiveServer, peer: str, forwarded_for: str | None = None):
        self.server, self.forwarded_for = server, forwarded_for
        headers = {"Origin": server.url}
        if forwarded_for is not None:
            headers["X-Forwarded-For"] = forwarded_for
        self.client = httpx.AsyncClient(
            base_url=server.url, headers=headers, timeout=30,
            transport=httpx.AsyncHTTPTransport(local_address=peer))

    async def sign_in(self, tenant: str, name: str, password: str = PASSWORD) -> int:
        form = await self.client.get("/ui/login")
        response = await self.client.post("/ui/login", data={
            "tenant": tenant, "name": name, "password": password,
            "csrf_token": csrf_of(form.text), "next": "/ui"})
        return response.status_code

    async def aclose(self) -> None:
        await self.client.aclose()


@pytest.fixture
async def browsers() -> AsyncIterator[list[Browser]]:
    made: list[Browser] = []
    yield made
    for browser in made:
        await browser.aclose()


async def _lock_address(browser: Browser, tenant: str) -> None:
    """Spray ``ADDRESS_LIMIT`` names (each once, so no name locks) until the address locks."""
    for index in range(ADDRESS_LIMIT):
        assert await browser.sign_in(tenant, f"nobody-{index}", "guess guess guess") == 401


async def test_made_up_forwarded_for_from_an_untrusted_peer_is_ignored(
        plain: tuple[LiveServer, str], tenant: str, browsers: list[Browser]) -> None:
    """Fault 4: a guesser on loopback past the address limit kept going by sending a new
    made-up ``X-Forwarded-For`` each time; with no proxy trusted the header changes nothing,
    and a right password from the locked address is refused too."""
    server, database_url = plain
    await _user(database_url, tenant, "alice")
    guesser = Browser(server, PROXY)
    spoofing = Browser(server, PROXY, forwarded_for="203.0.113.9")
    browsers += [guesser, spoofing]
    try:
        await _lock_address(guesser, tenant)
        assert await guesser.sign_in(tenant, "nobody-x", "guess guess guess") == 429
        assert await spoofing.sign_in(tenant, "nobody-y", "guess guess guess") == 429
        assert await spoofing.sign_in(tenant, "alice") == 429  # the address is locked
        elsewhere = Browser(server, _peer())
        browsers.append(elsewhere)
        assert await elsewhere.sign_in(tenant, "alice") == 303
    finally:  # the loopback address is shared with other live-server tests
        db = Database(database_url)
        try:
            async with db.transaction() as conn:
                await conn.execute(delete(signin_failures).where(
                    signin_failures.c.key == f"address:{PROXY}"))
        finally:
            await db.dispose()


async def test_forwarded_for_counts_only_from_a_trusted_proxy(
        proxied: tuple[LiveServer, str], tenant: str, browsers: list[Browser]) -> None:
    server, database_url = proxied
    await _user(database_url, tenant, "alice")
    guesser = _documentation_address()
    via_proxy = Browser(server, PROXY, forwarded_for=guesser)
    browsers.append(via_proxy)
    await _lock_address(via_proxy, tenant)
    assert await via_proxy.sign_in(tenant, "alice") == 429  # the guesser's address is locked
    # The guesser's own made-up entry is left of what the proxy appends: still the guesser.
    prefixed = Browser(server, PROXY, forwarded_for=f"203.0.113.7, {guesser}")
    browsers.append(prefixed)
    assert await prefixed.sign_in(tenant, "nobody-z", "guess guess guess") == 429
    # The locked address does not lock out the right account from another address.
    colleague = Browser(server, PROXY, forwarded_for=_documentation_address())
    browsers.append(colleague)
    assert await colleague.sign_in(tenant, "alice") == 303


async def test_forwarded_for_from_a_peer_that_is_not_the_proxy_is_ignored(
        proxied: tuple[LiveServer, str], tenant: str, browsers: list[Browser]) -> None:
    server, database_url = proxied
    await _user(database_url, tenant, "alice")
    peer = _peer()
    guesser = Browser(server, peer)
    spoofing = Browser(server, peer, forwarded_for=_documentation_address())
    browsers += [guesser, spoofing]
    await _lock_address(guesser, tenant)
    assert await spoofing.sign_in(tenant, "nobody-y", "guess guess guess") == 429
    assert await spoofing.sign_in(tenant, "alice") == 429


async def test_a_flood_on_one_name_does_not_lock_its_address_for_others(
        proxied: tuple[LiveServer, str], tenant: str, browsers: list[Browser]) -> None:
    server, database_url = proxied
    await _user(database_url, tenant, "alice")
    await _user(database_url, tenant, "bob")
    office = Browser(server, PROXY, forwarded_for=_documentation_address())
    browsers.append(office)
    codes = [await office.sign_in(tenant, "bob", "wrong password!") for _ in range(10)]
    assert codes == [401] * ACCOUNT_LIMIT + [429] * (10 - ACCOUNT_LIMIT)
    assert await office.sign_in(tenant, "alice") == 303
    # The flooded name is locked from everywhere, its right password included.
    home = Browser(server, PROXY, forwarded_for=_documentation_address())
    browsers.append(home)
    assert await home.sign_in(tenant, "bob") == 429
    assert await home.sign_in(tenant, "BOB") == 429  # one name in any case


async def test_a_flooded_name_past_its_limit_never_feeds_its_address(
        harness: Any, tenant: str) -> None:
    """Through many back-off locks of one name, its address stays open for other names;
    each lock is longer than the one before, up to the lockout."""
    clock = FrozenClock(datetime(2030, 1, 1, tzinfo=UTC))
    limits = accounts.SigninLimits(account=3, address=5, window_s=600, lockout_s=240,
                                   backoff_s=30)
    await add_user(harness.db, tenant, "alice", "finance", clock=system_clock)
    address = _documentation_address()

    async def attempt(name: str, password: str) -> str:
        try:
            await accounts.authenticate_password(harness.db, tenant=tenant, name=name,
                                                 password=password, address=address,
                                                 clock=clock, limits=limits)
        except accounts.Unauthenticated as exc:
            return exc.code
        return "ok"

    for _ in range(3):
        assert await attempt("bob", "wrong password!") == "invalid_credentials"
    for lock_s in (30, 60, 120, 240, 240):
        assert await attempt("bob", "wrong password!") == "signin_throttled"
        clock.advance(seconds=lock_s - 1)
        assert await attempt("bob", "wrong password!") == "signin_throttled"
        clock.advance(seconds=1)
        assert await attempt("bob", "wrong password!") == "invalid_credentials"
    assert await attempt("alice", PASSWORD) == "ok"
