"""Offline permit verification against the server's JWKS (extra ``cosigner-client[jwks]``).

An executor may check a permit without calling the server: signature (``alg`` pinned per
key to the one its JWKS entry names, ``Ed25519`` (RFC 9864, the default when the entry names
none) or ``EdDSA`` (RFC 8037, servers run with ``COSIGNER_SIGNING_ALG=EdDSA``); the key
chosen by ``kid`` from the JWKS only), issuer, audience,
``exp``/``nbf`` (expired when ``now >= exp``, RFC 7519 §4.1.4), tenant, tool and the args
hash of the exact arguments. Built with :meth:`PermitVerifier.from_server` it follows key
rotations: an unknown ``kid`` refetches the JWKS (rate-limited). It cannot know whether the
permit was already redeemed or revoked: single use needs ``Gate.redeem``; use this as an
extra check, not instead.
"""

from __future__ import annotations

import base64
import hmac
import json
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from cosigner_client.canonical import args_hash
from cosigner_client.errors import ServerRefused

try:
    from joserfc import jws
    from joserfc.errors import JoseError
    from joserfc.jwk import OKPKey
except ImportError as exc:  # pragma: no cover - depends on the installed extra
    raise ImportError("install cosigner-client[jwks] for offline permit verification"
                      ) from exc

__all__ = ["PermitVerifier"]

ALGORITHM = "Ed25519"
ALGORITHMS = frozenset({"Ed25519", "EdDSA"})
PERMIT_TYP = "cosigner-permit+jwt"


def _refuse(code: str, detail: str) -> ServerRefused:
    return ServerRefused(detail, code=code)


def _segment(part: str) -> dict[str, Any]:
    try:
        value = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except ValueError:
        raise _refuse("malformed_permit", "permit segment is not base64url JSON") from None
    if not isinstance(value, dict):
        raise _refuse("malformed_permit", "permit segment is not a JSON object")
    return value


def _import_keys(jwks: Mapping[str, Any]) -> dict[str, tuple[OKPKey, str]]:
    """``{kid: (public key, the one alg it verifies)}`` of the JWKS's Ed25519 keys."""
    return {k["kid"]: (OKPKey.import_key(dict(k)), k.get("alg", ALGORITHM))
            for k in jwks.get("keys", [])
            if k.get("kty") == "OKP" and k.get("crv") == "Ed25519" and "kid" in k
            and k.get("alg", ALGORITHM) in ALGORITHMS}


class PermitVerifier:
    """Verify permits with a JWK Set (``GET /.well-known/jwks.json``).

    ``PermitVerifier(jwks)`` uses a fixed set. ``PermitVerifier.from_server(url)`` (or
    ``jwks_url=``) fetches the set, caches it and fetches it again when a permit names a
    ``kid`` it does not know — at most once per ``refetch_interval`` seconds, so a flood
    of bogus ``kid`` values costs the server one request per interval — so a long-lived
    verifier follows a key rotation (``cosigner keys rotate``) without a restart.
    """

    def __init__(self, jwks: Mapping[str, Any] | None = None, *, issuer: str = "cosigner",
                 audience: str = "cosigner-executor", jwks_url: str | None = None,
                 refetch_interval: float = 10.0, timeout: float = 2.0,
                 clock: Callable[[], float] = time.monotonic,
                 transport: httpx.BaseTransport | None = None) -> None:
        if jwks is None and jwks_url is None:
            raise ValueError("pass a JWK Set or jwks_url")
        self.issuer, self.audience = issuer, audience
        self.jwks_url, self.refetch_interval, self.timeout = jwks_url, refetch_interval, timeout
        self._clock, self._transport = clock, transport
        self._lock = threading.Lock()
        self._fetched_at: float | None = None
        self.fetches = 0
        self._keys = _import_keys(jwks) if jwks is not None else {}
        if jwks is None:
            self._refetch()

    @classmethod
    def from_server(cls, url: str, **kwargs: Any) -> PermitVerifier:
        """A verifier that follows the server's JWKS (``<url>/.well-known/jwks.json``)."""
        return cls(jwks_url=url.rstrip("/") + "/.well-known/jwks.json", **kwargs)

    @property
    def kids(self) -> frozenset[str]:
        return frozenset(self._keys)

    def _refetch(self) -> bool:
        """Fetch the JWKS unless it was fetched less than ``refetch_interval`` s ago.
        A failed fetch keeps the cached keys. True when new keys were loaded."""
        if self.jwks_url is None:
            return False
        with self._lock:
            now = self._clock()
            if self._fetched_at is not None and now - self._fetched_at < self.refetch_interval:
                return False
            self._fetched_at = now
            self.fetches += 1
            try:
                with httpx.Client(transport=self._transport, timeout=self.timeout) as http:
                    resp = http.get(self.jwks_url)
                resp.raise_for_status()
                keys = _import_keys(resp.json())
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                return False
            self._keys = keys
            return True

    def _key(self, kid: str) -> tuple[OKPKey, str] | None:
        found = self._keys.get(kid)
        if found is None and self._refetch():
            found = self._keys.get(kid)
        return found

    def verify(self, token: str, *, tool: str, args: dict[str, Any],
               tenant: str | None = None, now: float | None = None) -> dict[str, Any]:
        """The permit's claims when it is valid for exactly ``tool(args)``.

        Raises:
            ServerRefused: ``malformed_permit``, ``bad_signature``, ``unknown_kid``,
                ``expired``, ``not_yet_valid``, ``wrong_audience``, ``tenant_mismatch``,
                ``tool_mismatch``, ``args_mismatch`` (the server's codes).
        """
        parts = token.split(".") if isinstance(token, str) else []
        if len(parts) != 3:
            raise _refuse("malformed_permit", "not a compact JWS")
        header = _segment(parts[0])
        if header.get("alg") not in ALGORITHMS or header.get("typ") != PERMIT_TYP:
            raise _refuse("bad_signature", "algorithm or token type not accepted")
        found = self._key(str(header.get("kid")))
        if found is None:
            raise _refuse("unknown_kid", "signing key is not in the JWKS")
        key, alg = found
        if header["alg"] != alg:  # the key's own alg only, never both names (K17)
            raise _refuse("bad_signature", "algorithm not accepted for this key")
        try:
            with warnings.catch_warnings():  # joserfc flags EdDSA as deprecated (RFC 9864)
                warnings.simplefilter("ignore")
                jws.deserialize_compact(token, key, algorithms=[alg])
        except JoseError:
            raise _refuse("bad_signature", "signature verification failed") from None
        claims = _segment(parts[1])
        current = int(time.time() if now is None else now)
        exp, nbf = claims.get("exp"), claims.get("nbf")
        if type(exp) is not int or type(nbf) is not int:
            raise _refuse("malformed_permit", "exp/nbf missing or not integers")
        if claims.get("iss") != self.issuer:
            raise _refuse("bad_signature", "permit was not issued by this server")
        if claims.get("aud") != self.audience:
            raise _refuse("wrong_audience", "permit is meant for another audience")
        if current >= exp:
            raise _refuse("expired", "permit has expired")
        if current < nbf:
            raise _refuse("not_yet_valid", "permit is not valid yet")
        if tenant is not None and claims.get("tenant") != tenant:
            raise _refuse("tenant_mismatch", "permit belongs to another tenant")
        if claims.get("tool") != tool:
            raise _refuse("tool_mismatch", "permit is for another tool")
        bound = str(claims.get("args_hash", ""))
        if not hmac.compare_digest(bound.encode(), args_hash(args).encode()):
            raise _refuse("args_mismatch", "arguments differ from the approved ones")
        return claims
