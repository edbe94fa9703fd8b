"""The relying party's checks without a browser: ID-token claims (OpenID Connect Core 1.0
§3.1.3.7), signature and ``alg`` against a provider's published keys (rotation refetches
the JWKS, rate-limited), pending sign-ins (single use, bound to the browser, expiring),
the subject and roles a token gives. The provider here is a small ASGI app serving a
discovery document and a JWKS over httpx's ASGI transport; the real provider end to end
is tests/oidc."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import OctKey, RSAKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from cosigner.core.errors import SignInRefused
from cosigner.core.settings import OidcProvider
from cosigner.db.database import Database
from cosigner.identity import oidc_signin
from cosigner.identity.oidc import IdToken, OidcClients, check_claims

ISSUER = "https://idp.example.test"
NOW = 1_900_000_000.0


def settings(**overrides: Any) -> OidcProvider:
    return OidcProvider(**{"issuer": ISSUER, "client_id": "cosigner", "client_secret": "x",
                           "role_map": {"fin": ["finance"], "ops": ["finance", "ops"]},
                           **overrides})


def claims(**overrides: Any) -> dict[str, Any]:
    return {"iss": ISSUER, "aud": "cosigner", "sub": "248289761001", "nonce": "n-1",
            "iat": NOW - 5, "exp": NOW + 300, "auth_time": int(NOW) - 10, **overrides}


@pytest.mark.parametrize(("changes", "code"), [
    ({"iss": "https://evil.example"}, "oidc_wrong_issuer"),
    ({"aud": "another-client"}, "oidc_wrong_audience"),
    ({"aud": ["cosigner", "another"]}, "oidc_wrong_audience"),  # several: azp required
    ({"exp": NOW - 61}, "oidc_expired"),                          # past the 60 s leeway
    ({"iat": NOW + 61}, "oidc_bad_token"),
    ({"nonce": "n-2"}, "oidc_nonce_mismatch"),
    ({"nonce": None}, "oidc_nonce_mismatch"),
    ({"sub": ""}, "oidc_bad_token"),
    ({"auth_time": int(NOW) + 120}, "oidc_bad_token"),
    # Before the epoch: not a time, and beyond the session table's BIGINT (a 500 there).
    ({"auth_time": -10**30}, "oidc_bad_token"),
    ({"auth_time": -1}, "oidc_bad_token"),
    # Longer than the session table's acr column (PostgreSQL refuses it: a 500 there).
    ({"acr": "urn:x:" + "a" * 251}, "oidc_bad_token"),
    ({"exp": None}, "oidc_bad_token"),
])
def test_claims_that_are_refused(changes: dict[str, Any], code: str) -> None:
    token = {k: v for k, v in claims(**changes).items() if v is not None}
    with pytest.raises(SignInRefused) as caught:
        check_claims(settings(), token, nonce="n-1", now=NOW)
    assert caught.value.code == code


@pytest.mark.parametrize("changes", [
    {}, {"exp": NOW - 59}, {"aud": ["cosigner", "x"], "azp": "cosigner"}, {"auth_time": None},
])
def test_claims_that_are_accepted(changes: dict[str, Any]) -> None:
    token = {k: v for k, v in claims(**changes).items() if v is not None}
    check_claims(settings(), token, nonce="n-1", now=NOW)


class Provider:
    """Discovery + JWKS over ASGI; the test swaps keys and counts JWKS fetches."""

    def __init__(self, algs: list[str] | None = None) -> None:
        self.keys = [RSAKey.generate_key(2048, parameters={"kid": "k1"}, private=True)]
        self.jwks_fetches = 0
        self.algs = algs or ["RS256"]

        async def discovery(_: Request) -> JSONResponse:
            return JSONResponse({"issuer": ISSUER, "authorization_endpoint": ISSUER + "/auth",
                                 "token_endpoint": ISSUER + "/token",
                                 "jwks_uri": ISSUER + "/jwks",
                                 "id_token_signing_alg_values_supported": self.algs})

        async def jwks(_: Request) -> JSONResponse:
            self.jwks_fetches += 1
            return JSONResponse({"keys": [k.as_dict(private=False) for k in self.keys]})

        self.app = Starlette(routes=[Route("/.well-known/openid-configuration", discovery),
                                     Route("/jwks", jwks)])

    def sign(self, key: Any, alg: str = "RS256", **changes: Any) -> str:
        now = time.time()
        return jwt.encode({"alg": alg, "kid": key.kid}, claims(
            iat=now - 5, exp=now + 300, auth_time=int(now) - 10, **changes), key,
            algorithms=[alg])


async def test_signature_alg_and_key_rotation() -> None:
    idp = Provider()
    clients = OidcClients(httpx.ASGITransport(app=idp.app), refetch_s=0)
    meta = await clients.metadata(settings())
    ok = await clients.validate(settings(), meta, idp.sign(idp.keys[0]), nonce="n-1",
                                now=time.time())
    assert ok.sub == "248289761001" and idp.jwks_fetches == 1
    # Another key under the same kid: refused, no refetch (the kid is known).
    forged = RSAKey.generate_key(2048, parameters={"kid": "k1"}, private=True)
    with pytest.raises(SignInRefused) as caught:
        await clients.validate(settings(), meta, idp.sign(forged), nonce="n-1", now=time.time())
    assert caught.value.code == "oidc_bad_signature" and idp.jwks_fetches == 1
    # The provider rotates: a new kid refetches the key set once, then verifies.
    idp.keys = [RSAKey.generate_key(2048, parameters={"kid": "k2"}, private=True)]
    await clients.validate(settings(), meta, idp.sign(idp.keys[0]), nonce="n-1",
                           now=time.time())
    assert idp.jwks_fetches == 2
    # An HMAC keyed with the client secret, or an alg the provider does not publish.
    secret = OctKey.import_key("x" * 32, parameters={"kid": "k2"})
    with pytest.raises(SignInRefused) as caught:
        await clients.validate(settings(), meta, idp.sign(secret, "HS256"), nonce="n-1",
                               now=time.time())
    assert caught.value.code == "oidc_bad_signature"


async def test_unknown_kids_refetch_at_most_every_refetch_interval() -> None:
    idp = Provider()
    clients = OidcClients(httpx.ASGITransport(app=idp.app))  # default 10 s
    meta = await clients.metadata(settings())
    stranger = RSAKey.generate_key(2048, parameters={"kid": "made-up"}, private=True)
    for _ in range(3):
        with pytest.raises(SignInRefused):
            await clients.validate(settings(), meta, idp.sign(stranger), nonce="n-1",
                                   now=time.time())
    assert idp.jwks_fetches == 1


async def test_none_and_hmac_are_never_accepted_even_when_published() -> None:
    idp = Provider(algs=["none", "HS256"])
    clients = OidcClients(httpx.ASGITransport(app=idp.app))
    with pytest.raises(SignInRefused) as caught:
        await clients.metadata(settings())
    assert caught.value.code == "oidc_unavailable"


async def test_a_discovery_document_for_another_issuer_is_refused() -> None:
    idp = Provider()
    clients = OidcClients(httpx.ASGITransport(app=idp.app))
    with pytest.raises(SignInRefused) as caught:
        await clients.metadata(settings(issuer="https://idp.example.test/other"))
    assert caught.value.code == "oidc_unavailable"


def test_roles_come_from_the_configured_claim_only() -> None:
    provider = settings(roles_claim="roles")
    assert oidc_signin.mapped_roles(provider, {"roles": ["ops", "x"], "groups": ["fin"]}) == (
        ["finance", "ops"], ["ops", "x"])
    assert oidc_signin.mapped_roles(provider, {"roles": "fin"}) == (["finance"], ["fin"])
    assert oidc_signin.mapped_roles(provider, {"roles": 7}) == ([], [])


@pytest.fixture
async def db(database_url: str) -> Any:
    database = Database(database_url)
    yield database
    await database.dispose()


HERE: dict[str, Any] = {"address": "192.0.2.10", "max_pending": 1000}


async def test_a_pending_sign_in_works_once_in_its_own_browser(db: Database,
                                                               tenant: str) -> None:
    now = datetime.now(UTC)
    state, pending = await oidc_signin.begin(db, tenant=tenant, browser_secret="browser-a",
                                             next_path="/ui", step_up=None, now=now, ttl_s=60,
                                             **HERE)
    with pytest.raises(SignInRefused) as other:  # another browser: refused, and spent
        await oidc_signin.consume(db, state=state, browser_secret="browser-b", now=now)
    assert other.value.code == "oidc_state_invalid"
    with pytest.raises(SignInRefused):
        await oidc_signin.consume(db, state=state, browser_secret="browser-a", now=now)
    state, pending = await oidc_signin.begin(db, tenant=tenant, browser_secret="browser-a",
                                             next_path="/ui/x", step_up={"max_age": 0},
                                             now=now, ttl_s=60, **HERE)
    got = await oidc_signin.consume(db, state=state, browser_secret="browser-a", now=now)
    assert (got.nonce, got.code_verifier, got.next_path, got.step_up) == (
        pending.nonce, pending.code_verifier, "/ui/x", {"max_age": 0})
    with pytest.raises(SignInRefused) as replayed:
        await oidc_signin.consume(db, state=state, browser_secret="browser-a", now=now)
    assert replayed.value.code == "oidc_state_invalid"
    state, _ = await oidc_signin.begin(db, tenant=tenant, browser_secret="browser-a",
                                       next_path="/ui", step_up=None, now=now, ttl_s=60, **HERE)
    with pytest.raises(SignInRefused) as late:
        await oidc_signin.consume(db, state=state, browser_secret="browser-a",
                                  now=now + timedelta(seconds=60))
    assert late.value.code == "oidc_state_expired"


async def test_the_subject_is_the_issuers_sub_never_the_email(db: Database,
                                                              tenant: str) -> None:
    from cosigner.core.clock import system_clock

    token = IdToken({"sub": "00uAbC", "email": "alice@corp.example", "groups": ["fin"],
                     "acr": "urn:x", "amr": ["pwd", "otp"], "auth_time": 1_800_000_000})
    caller = await oidc_signin.sign_in(db, tenant=tenant, provider=settings(), token=token,
                                       clock=system_clock)
    assert caller.subject == f"oidc:{ISSUER}#00uabc" and caller.roles == {"finance"}
    assert caller.authn.record() == {"method": "oidc", "acr": "urn:x", "amr": ["pwd", "otp"],
                                     "auth_time": 1_800_000_000}
    # Another sub differing only in case is another person: refused, not merged.
    twin = IdToken({"sub": "00UABC", "groups": ["fin"]})
    with pytest.raises(SignInRefused) as caught:
        await oidc_signin.sign_in(db, tenant=tenant, provider=settings(), token=twin,
                                  clock=system_clock)
    assert caught.value.code == "oidc_subject_conflict"


async def test_a_slow_key_set_of_one_provider_does_not_hold_up_another() -> None:
    """Each tenant has its own provider: one whose JWKS endpoint hangs (down, or made to
    hang by whoever runs it) must not make every other tenant's sign-in wait for it."""
    import asyncio

    slow, fast = Provider(), Provider()
    release = asyncio.Event()

    async def hanging_jwks(_: Request) -> JSONResponse:
        await release.wait()
        return JSONResponse({"keys": [k.as_dict(private=False) for k in slow.keys]})

    async def slow_discovery(_: Request) -> JSONResponse:
        return JSONResponse({"issuer": "https://slow.example.test",
                             "authorization_endpoint": "https://slow.example.test/auth",
                             "token_endpoint": "https://slow.example.test/token",
                             "jwks_uri": "https://slow.example.test/jwks",
                             "id_token_signing_alg_values_supported": ["RS256"]})

    slow_app = Starlette(routes=[Route("/.well-known/openid-configuration", slow_discovery),
                                 Route("/jwks", hanging_jwks)])

    async def router(scope: Any, receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers") or [])
        app = slow_app if headers.get(b"host", b"").startswith(b"slow.") else fast.app
        await app(scope, receive, send)

    clients = OidcClients(httpx.ASGITransport(app=router))
    slow_meta = await clients.metadata(settings(issuer="https://slow.example.test"))
    fast_meta = await clients.metadata(settings())
    stuck = asyncio.create_task(clients.key_set(slow_meta))
    await asyncio.sleep(0.05)  # the slow fetch is under way
    try:
        await asyncio.wait_for(clients.key_set(fast_meta), timeout=2)
    finally:
        release.set()
        await stuck


async def test_every_sign_in_records_when_it_happened(db: Database, tenant: str) -> None:
    """``principals.last_signed_in_at`` is the freshness a Slack click needs: a single
    sign-on sets it, a later one moves it (the roles were confirmed at the provider)."""
    from sqlalchemy import select

    from cosigner.core.clock import FrozenClock
    from cosigner.db.tables import principals

    clock = FrozenClock(datetime(2026, 12, 1, 6, 0, tzinfo=UTC))
    token = IdToken({"sub": "fresh-1", "groups": ["fin"]})

    async def stamp() -> datetime:
        async with db.read() as conn:
            value = (await conn.execute(select(principals.c.last_signed_in_at).where(
                principals.c.tenant == tenant))).scalar_one()
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    await oidc_signin.sign_in(db, tenant=tenant, provider=settings(), token=token,
                              clock=clock)
    assert await stamp() == clock()
    clock.advance(hours=5)
    await oidc_signin.sign_in(db, tenant=tenant, provider=settings(), token=token,
                              clock=clock)
    assert await stamp() == clock()


def test_unfinished_sign_ins_count_an_ipv6_host_by_its_64() -> None:
    key = oidc_signin.address_key
    assert key("2001:db8:1:2:aaaa::1") == key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert key("2001:db8:1:3::1") != key("2001:db8:1:2::1")
    assert key("::ffff:198.51.100.7") == key("198.51.100.7") == "198.51.100.7"
    assert key("unknown") == "unknown"
