"""OpenID Connect relying party: discovery, JWKS, the code flow with PKCE, ID-token checks.

Authorization code flow with PKCE (RFC 7636, ``S256``) built with Authlib's OAuth 2 client
(authorization URL, code exchange authenticated with ``client_secret_basic``); the ID token
is checked here with joserfc, all of OpenID Connect Core 1.0 §3.1.3.7:

* signature: a key of the provider's JWKS (fetched from its discovery document's
  ``jwks_uri``, cached; an unknown ``kid`` refetches it once, at most every
  :data:`JWKS_REFETCH_S`), under an ``alg`` the provider's metadata lists in
  ``id_token_signing_alg_values_supported`` — asymmetric ones only, never ``none`` and
  never an HMAC keyed with the client secret;
* ``iss`` equals the configured issuer; ``aud`` contains the client id (with several
  audiences, ``azp`` must be the client id); ``exp`` in the future and ``iat`` not in the
  future, each within the provider's ``leeway_s``; ``nonce`` equals the one sent with this
  sign-in; ``sub`` present; ``auth_time`` (when present) an integer from the epoch to now;
  ``acr`` (when a string) at most :data:`MAX_ACR_CHARS` characters.

Discovery documents and key sets are cached in process memory: they are public and the
same on every replica. What must be shared (the pending sign-in's state, nonce and code
verifier) is in the database (:mod:`cosigner.identity.oidc_signin`).

Every refusal is a :class:`cosigner.core.errors.SignInRefused` with a stable code
(``oidc_unavailable``, ``oidc_token_exchange_failed``, ``oidc_bad_signature``,
``oidc_wrong_issuer``, ``oidc_wrong_audience``, ``oidc_expired``, ``oidc_nonce_mismatch``,
``oidc_bad_token``); the messages never contain a token.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cosigner.core.errors import SignInRefused
from cosigner.core.settings import OidcProvider

if TYPE_CHECKING:  # httpx, Authlib and joserfc load on the first sign-in, not with the app
    import httpx
    from authlib.integrations.httpx_client import AsyncOAuth2Client
    from joserfc.jwk import KeySet

#: Discovery documents and key sets are refetched after this long (s).
METADATA_TTL_S = 3600
#: An unknown ``kid`` refetches the key set at most this often per issuer (s), so tokens
#: with made-up key ids cannot make Cosigner hammer the provider.
JWKS_REFETCH_S = 10
HTTP_TIMEOUT_S = 10.0
#: The longest ``acr`` kept (the sessions table's column); a longer one is refused.
MAX_ACR_CHARS = 256
#: ``alg`` values never accepted for an ID token: unsigned, or keyed by the client secret.
_REFUSED_ALGS = frozenset({"none", "HS256", "HS384", "HS512"})


@dataclass(frozen=True, slots=True)
class Metadata:
    """The parts of a provider's discovery document the code flow uses."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    algorithms: tuple[str, ...]
    iss_parameter: bool  # RFC 9207: the authorization response carries ``iss``


@dataclass(frozen=True, slots=True)
class IdToken:
    """The checked claims of an ID token the code flow returned."""

    claims: dict[str, Any]

    @property
    def sub(self) -> str:
        return str(self.claims["sub"])

    @property
    def acr(self) -> str | None:
        value = self.claims.get("acr")
        return value if isinstance(value, str) else None

    @property
    def amr(self) -> tuple[str, ...]:
        value = self.claims.get("amr")
        return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()

    @property
    def auth_time(self) -> int | None:
        value = self.claims.get("auth_time")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


class OidcClients:
    """Discovery and JWKS caches, and the protocol steps, for every configured issuer."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None, *,
                 refetch_s: float = JWKS_REFETCH_S) -> None:
        self._transport = transport
        self._refetch_s = refetch_s
        self._metadata: dict[str, tuple[float, Metadata]] = {}
        self._keys: dict[str, tuple[float, KeySet]] = {}  # jwks_uri -> (fetched, keys)
        # One lock per key set: a provider whose JWKS endpoint hangs holds up only the
        # sign-ins of its own tenant(s), never another tenant's.
        self._locks: dict[str, asyncio.Lock] = {}

    def _http(self) -> httpx.AsyncClient:
        import httpx

        return httpx.AsyncClient(transport=self._transport, timeout=HTTP_TIMEOUT_S,
                                 follow_redirects=False)

    async def _get_json(self, url: str) -> dict[str, Any]:
        import httpx

        try:
            async with self._http() as http:
                response = await http.get(url, headers={"Accept": "application/json"})
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise SignInRefused(f"the identity provider could not be reached ({url})",
                                code="oidc_unavailable") from exc
        if not isinstance(body, dict):
            raise SignInRefused(f"{url} is not a JSON object", code="oidc_unavailable")
        return body

    async def metadata(self, provider: OidcProvider) -> Metadata:
        """The provider's discovery document (cached :data:`METADATA_TTL_S`).

        Raises:
            SignInRefused: ``oidc_unavailable`` (unreachable, not JSON, or its ``issuer``
                is not the configured one — OpenID Connect Discovery 1.0 §4.3).
        """
        cached = self._metadata.get(provider.issuer)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        doc = await self._get_json(provider.issuer.rstrip("/")
                                   + "/.well-known/openid-configuration")
        if doc.get("issuer") != provider.issuer:
            raise SignInRefused("the discovery document names another issuer",
                                code="oidc_unavailable")
        algs = doc.get("id_token_signing_alg_values_supported") or ["RS256"]
        try:
            meta = Metadata(
                issuer=provider.issuer,
                authorization_endpoint=str(doc["authorization_endpoint"]),
                token_endpoint=str(doc["token_endpoint"]), jwks_uri=str(doc["jwks_uri"]),
                algorithms=tuple(a for a in algs if isinstance(a, str)
                                 and a not in _REFUSED_ALGS),
                iss_parameter=doc.get("authorization_response_iss_parameter_supported") is True)
        except KeyError as exc:
            raise SignInRefused(f"the discovery document lacks {exc.args[0]}",
                                code="oidc_unavailable") from exc
        if not meta.algorithms:
            raise SignInRefused("the provider signs ID tokens with no acceptable alg",
                                code="oidc_unavailable")
        self._metadata[provider.issuer] = (time.monotonic() + METADATA_TTL_S, meta)
        return meta

    async def key_set(self, meta: Metadata, *, refresh: bool = False) -> KeySet:
        """The provider's JWKS (cached; ``refresh`` refetches unless fetched within
        ``refetch_s``, default :data:`JWKS_REFETCH_S`)."""
        async with self._locks.setdefault(meta.jwks_uri, asyncio.Lock()):
            cached = self._keys.get(meta.jwks_uri)
            now = time.monotonic()
            if cached is not None:
                age = now - cached[0]
                if age < (self._refetch_s if refresh else METADATA_TTL_S):
                    return cached[1]
            doc = await self._get_json(meta.jwks_uri)
            from joserfc.errors import JoseError
            from joserfc.jwk import KeySet

            try:
                keys = KeySet.import_key_set(doc)  # type: ignore[arg-type]
            except (JoseError, ValueError, TypeError, KeyError) as exc:
                raise SignInRefused("the provider's JWKS is not a valid key set",
                                    code="oidc_unavailable") from exc
            self._keys[meta.jwks_uri] = (now, keys)
            return keys

    def _client(self, provider: OidcProvider, redirect_uri: str) -> AsyncOAuth2Client:
        from authlib.integrations.httpx_client import AsyncOAuth2Client

        return AsyncOAuth2Client(
            client_id=provider.client_id,
            client_secret=provider.client_secret.get_secret_value(),
            scope=" ".join(provider.scopes), redirect_uri=redirect_uri,
            code_challenge_method="S256", token_endpoint_auth_method="client_secret_basic",
            transport=self._transport, timeout=HTTP_TIMEOUT_S)

    def authorization_url(self, provider: OidcProvider, meta: Metadata, *, redirect_uri: str,
                          state: str, nonce: str, code_verifier: str,
                          acr_values: str | None = None, max_age: int | None = None,
                          prompt: str | None = None) -> str:
        """The provider's authorization URL for one sign-in (``response_type=code``,
        PKCE ``S256``, ``nonce``; for a step-up also ``acr_values``, ``max_age`` and
        ``prompt=login``, OpenID Connect Core 1.0 §3.1.2.1)."""
        extra: dict[str, Any] = {"nonce": nonce}
        if acr_values:
            extra["acr_values"] = acr_values
        if max_age is not None:
            extra["max_age"] = str(max_age)
        if prompt:
            extra["prompt"] = prompt
        url, _ = self._client(provider, redirect_uri).create_authorization_url(
            meta.authorization_endpoint, state=state, code_verifier=code_verifier, **extra)
        return str(url)

    async def exchange(self, provider: OidcProvider, meta: Metadata, *, code: str,
                       redirect_uri: str, code_verifier: str) -> str:
        """Exchange the authorization code at the token endpoint; returns the ID token.

        Raises:
            SignInRefused: ``oidc_token_exchange_failed`` (refused, unreachable, or no
                ``id_token`` in the answer).
        """
        try:
            async with self._client(provider, redirect_uri) as client:
                token = await client.fetch_token(
                    meta.token_endpoint, grant_type="authorization_code", code=code,
                    code_verifier=code_verifier)
        except Exception as exc:  # noqa: BLE001 - Authlib raises OAuthError, httpx errors
            raise SignInRefused("the identity provider refused the code exchange",
                                code="oidc_token_exchange_failed") from exc
        id_token = token.get("id_token") if isinstance(token, dict) else None
        if not isinstance(id_token, str):
            raise SignInRefused("the token response has no ID token",
                                code="oidc_token_exchange_failed")
        return id_token

    async def validate(self, provider: OidcProvider, meta: Metadata, id_token: str, *,
                       nonce: str, now: float) -> IdToken:
        """Check ``id_token`` (module docstring); ``now`` in seconds since the epoch.

        Raises:
            SignInRefused: ``oidc_bad_signature``, ``oidc_wrong_issuer``,
                ``oidc_wrong_audience``, ``oidc_expired``, ``oidc_nonce_mismatch``,
                ``oidc_bad_token``.
        """
        from joserfc import jws, jwt
        from joserfc.errors import BadSignatureError, JoseError

        keys = await self.key_set(meta)
        try:
            header = jws.extract_compact(id_token.encode()).protected
        except (JoseError, ValueError) as exc:
            raise SignInRefused("the ID token is malformed", code="oidc_bad_token") from exc
        if header.get("alg") not in meta.algorithms:
            raise SignInRefused(f"the ID token's alg {str(header.get('alg'))[:20]!r} is not "
                                "one the provider publishes", code="oidc_bad_signature")
        kid = header.get("kid")
        if kid is not None and not any(k.kid == kid for k in keys.keys):
            keys = await self.key_set(meta, refresh=True)  # the provider rotated its keys
        try:
            token = jwt.decode(id_token, keys, algorithms=list(meta.algorithms))
        except BadSignatureError as exc:
            raise SignInRefused("the ID token's signature does not verify",
                                code="oidc_bad_signature") from exc
        except (JoseError, ValueError) as exc:
            raise SignInRefused("the ID token cannot be verified with the provider's keys",
                                code="oidc_bad_signature") from exc
        check_claims(provider, token.claims, nonce=nonce, now=now)
        return IdToken(dict(token.claims))


def check_claims(provider: OidcProvider, claims: dict[str, Any], *, nonce: str,
                 now: float) -> None:
    """The claim checks of OpenID Connect Core 1.0 §3.1.3.7 (items 2-3, 9-11); raises
    :class:`SignInRefused` (codes in :meth:`OidcClients.validate`)."""
    leeway = provider.leeway_s
    if claims.get("iss") != provider.issuer:
        raise SignInRefused("the ID token was issued by another issuer",
                            code="oidc_wrong_issuer")
    aud = claims.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if provider.client_id not in audiences or (
            len(audiences) > 1 and claims.get("azp") != provider.client_id):
        raise SignInRefused("the ID token is not meant for this client",
                            code="oidc_wrong_audience")
    exp, iat = claims.get("exp"), claims.get("iat")
    if not isinstance(exp, (int, float)) or not isinstance(iat, (int, float)) or isinstance(
            exp, bool) or isinstance(iat, bool):
        raise SignInRefused("the ID token lacks exp or iat", code="oidc_bad_token")
    if now >= exp + leeway:
        raise SignInRefused("the ID token has expired", code="oidc_expired")
    if iat > now + leeway:
        raise SignInRefused("the ID token was issued in the future", code="oidc_bad_token")
    sent = claims.get("nonce")
    if not isinstance(sent, str) or not _equal(sent, nonce):
        raise SignInRefused("the ID token's nonce is not this sign-in's",
                            code="oidc_nonce_mismatch")
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub or len(sub) > 255:
        raise SignInRefused("the ID token has no usable sub", code="oidc_bad_token")
    acr = claims.get("acr")
    if isinstance(acr, str) and len(acr) > MAX_ACR_CHARS:
        raise SignInRefused("the ID token's acr is too long", code="oidc_bad_token")
    auth_time = claims.get("auth_time")
    if auth_time is not None and (not isinstance(auth_time, int) or isinstance(
            auth_time, bool) or not 0 <= auth_time <= now + leeway):
        raise SignInRefused("the ID token's auth_time is not a past time",
                            code="oidc_bad_token")


def _equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
