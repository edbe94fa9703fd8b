"""Approver passkeys (WebAuthn credentials): registration, listing, removal, key export.

A person (a principal signed in to the web pages) registers one or more credentials with
:func:`begin_registration` / :func:`finish_registration` (W3C WebAuthn Level 3 §7.1, checked
by the py_webauthn library: challenge, origin, RP id, user presence and verification,
attestation statement). The relying party is the public URL (:func:`relying_party`). Every
registration and removal is a decision-log event (``passkey.registered``,
``passkey.removed``) carrying the credential id, its COSE public key (base64url), the RP id
and origin, so the log alone holds what checking a signed review needs
(:mod:`cosigner.audit.approver_signatures`). Challenges live in the database
(:mod:`cosigner.identity.passkey_challenges`): any replica finishes what another began.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.audit.chain import Event, append
from cosigner.core.clock import Clock, isoformat
from cosigner.core.errors import Forbidden, InvalidRequest, NotFound
from cosigner.core.review_statements import UNSIGNABLE_METHODS, b64url, from_b64url
from cosigner.db.database import Database
from cosigner.db.tables_passkeys import webauthn_credentials
from cosigner.identity import passkey_challenges as challenges
from cosigner.identity.principals import Caller

MAX_NAME_CHARS = 100
#: COSE algorithms offered at registration, preferred first (ES256, EdDSA, RS256).
ALGORITHMS = (-7, -8, -257)


@dataclass(frozen=True, slots=True)
class RelyingParty:
    """The WebAuthn relying party: ``id`` (a host name) and the exact ``origin``."""

    id: str
    origin: str
    name: str = "Cosigner"


def relying_party(public_url: str) -> RelyingParty:
    """The RP of ``COSIGNER_PUBLIC_URL``: its host is the RP id, ``scheme://host[:port]`` the
    origin (browsers allow WebAuthn on https, and on http only for ``localhost``)."""
    parts = urlsplit(public_url)
    host = (parts.hostname or "localhost").lower()
    default = {"http": 80, "https": 443}.get(parts.scheme)
    port = f":{parts.port}" if parts.port and parts.port != default else ""
    return RelyingParty(id=host, origin=f"{parts.scheme}://{host}{port}")


def _check_person(caller: Caller) -> None:
    if caller.kind != "user" or caller.authn.method in UNSIGNABLE_METHODS:
        raise Forbidden("only a person signed in to the web pages has passkeys",
                        code="forbidden")


async def begin_registration(db: Database, clock: Clock, caller: Caller,
                             rp: RelyingParty) -> dict[str, Any]:
    """Options for ``navigator.credentials.create()`` (WebAuthn JSON, base64url members).

    User verification is required; the caller's registered credentials are excluded.

    Raises:
        Forbidden: the caller is not a person's web session.
    """
    from webauthn import generate_registration_options, options_to_json
    from webauthn.helpers.structs import (
        AuthenticatorSelectionCriteria,
        PublicKeyCredentialDescriptor,
        ResidentKeyRequirement,
        UserVerificationRequirement,
    )

    _check_person(caller)
    now = clock()
    async with db.transaction() as conn:
        mine = await credentials_of(conn, caller.tenant, caller.subject)
        challenge = await challenges.issue(conn, caller, purpose="register", now=now)
    options = generate_registration_options(
        rp_id=rp.id, rp_name=rp.name, user_name=caller.subject,
        user_id=caller.principal_id.encode(), user_display_name=caller.subject,
        challenge=challenge, timeout=challenges.TTL_S * 1000,
        authenticator_selection=AuthenticatorSelectionCriteria(
            resident_key=ResidentKeyRequirement.PREFERRED,
            user_verification=UserVerificationRequirement.REQUIRED),
        exclude_credentials=[PublicKeyCredentialDescriptor(id=from_b64url(r.credential_id))
                             for r in mine],
        supported_pub_key_algs=list(ALGORITHMS))  # type: ignore[arg-type]
    import json

    out: dict[str, Any] = json.loads(options_to_json(options))
    return out


async def finish_registration(db: Database, clock: Clock, caller: Caller, rp: RelyingParty,
                              credential: Any, *, name: str = "") -> dict[str, Any]:
    """Verify ``navigator.credentials.create()``'s response and store the credential.

    The challenge must be one this person was issued, unused and not expired; it is used
    up whatever the outcome. Logs ``passkey.registered``, or ``passkey.registration_refused``
    with the code (committed before the error is raised). Returns :func:`credential_view`.

    Raises:
        Forbidden: not a person's web session. InvalidRequest: ``passkey_invalid`` (the
        response does not verify, or its challenge is unknown, used or expired),
        ``passkey_exists`` (already registered in this tenant).
    """
    _check_person(caller)
    name = (name or "passkey").strip()[:MAX_NAME_CHARS] or "passkey"
    now = clock()
    async with db.transaction() as conn:
        try:
            stored = await _register(conn, caller, rp, credential, name, now)
            error = None
        except InvalidRequest as exc:
            error = exc
            await append(conn, caller.tenant, [Event(
                type="passkey.registration_refused", actor=caller.actor(),
                principal=caller.subject, payload={"code": exc.code})], now=now)
    if error is not None:
        raise error
    return credential_view(stored)


async def _register(conn: AsyncConnection, caller: Caller, rp: RelyingParty, credential: Any,
                    name: str, now: datetime) -> Any:
    from webauthn import verify_registration_response
    from webauthn.helpers import decode_credential_public_key

    raw = challenges.client_challenge(credential, "webauthn.create")
    row = await challenges.take(conn, caller, purpose="register", challenge=raw, now=now)
    if row is None:
        raise InvalidRequest("no open registration for this passkey (expired or used)",
                             code="passkey_invalid")
    try:
        verified = verify_registration_response(
            credential=credential, expected_challenge=from_b64url(row.challenge),
            expected_rp_id=rp.id, expected_origin=rp.origin, require_user_verification=True,
            supported_pub_key_algs=list(ALGORITHMS))  # type: ignore[arg-type]
    except Exception as exc:  # InvalidRegistrationResponse and parse errors alike
        raise InvalidRequest(f"the passkey registration does not verify: {exc}"[:300],
                             code="passkey_invalid") from exc
    credential_id = b64url(verified.credential_id)
    if await find_any(conn, caller.tenant, credential_id) is not None:
        raise InvalidRequest("this passkey is already registered", code="passkey_exists")
    values = {
        "id": str(uuid.uuid4()), "tenant": caller.tenant, "credential_id": credential_id,
        "principal_id": caller.principal_id, "subject": caller.subject, "name": name,
        "public_key": b64url(verified.credential_public_key),
        "alg": int(decode_credential_public_key(verified.credential_public_key).alg),
        "sign_count": verified.sign_count, "aaguid": str(verified.aaguid),
        "fmt": str(getattr(verified.fmt, "value", verified.fmt)),
        "attestation_object": b64url(verified.attestation_object),
        "user_verified": verified.user_verified, "created_at": now}
    await conn.execute(webauthn_credentials.insert().values(**values))
    await append(conn, caller.tenant, [Event(
        type="passkey.registered", actor=caller.actor(), principal=caller.subject,
        payload={"credential_id": credential_id, "public_key": values["public_key"],
                 "alg": values["alg"], "subject": caller.subject,
                 "principal_id": caller.principal_id, "name": name,
                 "aaguid": values["aaguid"], "fmt": values["fmt"],
                 "attestation_object": values["attestation_object"],
                 "sign_count": verified.sign_count, "rp_id": rp.id,
                 "origin": rp.origin})], now=now)
    return await find_any(conn, caller.tenant, credential_id)


async def remove_credential(db: Database, clock: Clock, caller: Caller,
                            credential_id: str) -> dict[str, Any]:
    """Remove a credential: by the person it belongs to, or by an ``admin`` of the tenant.

    A removed credential never signs a review again; it stays listed (``removed_at``) so
    old signatures still name a known key. Logs ``passkey.removed``.

    Raises:
        NotFound: no such (live) credential in the caller's tenant, or not the caller's
        own and the caller is not an admin.
    """
    now = clock()
    async with db.transaction() as conn:
        row = await find_any(conn, caller.tenant, credential_id)
        if row is None or row.removed_at is not None or not (
                row.subject == caller.subject or caller.has_any("admin")):
            raise NotFound("no such passkey")
        await conn.execute(webauthn_credentials.update().where(
            webauthn_credentials.c.id == row.id, webauthn_credentials.c.removed_at.is_(None))
            .values(removed_at=now, removed_by=caller.subject))
        await append(conn, caller.tenant, [Event(
            type="passkey.removed", actor=caller.actor(), principal=row.subject,
            payload={"credential_id": row.credential_id, "public_key": row.public_key,
                     "alg": row.alg, "subject": row.subject,
                     "removed_by": caller.subject})], now=now)
        stored = await find_any(conn, caller.tenant, credential_id)
    return credential_view(stored)


async def find_any(conn: AsyncConnection, tenant: str, credential_id: str) -> Any:
    """The credential row in ``tenant`` (removed or not), or ``None``."""
    return (await conn.execute(select(webauthn_credentials).where(
        webauthn_credentials.c.tenant == tenant,
        webauthn_credentials.c.credential_id == credential_id))).first()


async def credentials_of(conn: AsyncConnection, tenant: str, subject: str | None = None, *,
                         include_removed: bool = False) -> list[Any]:
    """Credential rows of a tenant (of one canonical ``subject``), oldest first."""
    query = select(webauthn_credentials).where(webauthn_credentials.c.tenant == tenant)
    if subject is not None:
        query = query.where(webauthn_credentials.c.subject == subject)
    if not include_removed:
        query = query.where(webauthn_credentials.c.removed_at.is_(None))
    return list((await conn.execute(query.order_by(webauthn_credentials.c.created_at,
                                                   webauthn_credentials.c.id))).all())


def _time(at: datetime | None) -> str | None:
    return isoformat(at) if at is not None else None


def credential_view(row: Any) -> dict[str, Any]:
    """``{credential_id, subject, name, alg, aaguid, fmt, created_at, last_used_at,
    removed_at}`` (times RFC 3339 UTC or null)."""
    return {"credential_id": row.credential_id, "subject": row.subject, "name": row.name,
            "alg": row.alg, "aaguid": row.aaguid, "fmt": row.fmt,
            "created_at": _time(row.created_at), "last_used_at": _time(row.last_used_at),
            "removed_at": _time(row.removed_at)}


async def list_credentials(db: Database, caller: Caller, *, everyone: bool = False
                           ) -> list[dict[str, Any]]:
    """The caller's live credentials; ``everyone`` (``admin`` only): the tenant's."""
    if everyone:
        caller.require("admin")
    async with db.read() as conn:
        rows = await credentials_of(conn, caller.tenant, None if everyone else caller.subject)
    return [credential_view(r) for r in rows]


async def approver_keys(db: Database, tenant: str, rp: RelyingParty) -> dict[str, Any]:
    """The tenant's approver credentials as a JWK-Set-like document::

        {"rp_id": str, "origin": str,
         "keys": [{"kid": <credential id>, "sub": <subject>, "cose": <COSE key, base64url>,
                   "alg": "ES256" | "EdDSA" | "RS256", "kty", "crv"/"x"/"y" | "n"/"e",
                   "created_at": str, "removed_at": str | null}]}

    Removed credentials stay listed with ``removed_at``: a signature made before then is
    still theirs (RFC 7517 members where the key type has them).
    """
    async with db.read() as conn:
        rows = await credentials_of(conn, tenant, include_removed=True)
    return {"rp_id": rp.id, "origin": rp.origin,
            "keys": [{**_jwk(r.public_key), "kid": r.credential_id, "sub": r.subject,
                      "cose": r.public_key, "created_at": _time(r.created_at),
                      "removed_at": _time(r.removed_at)} for r in rows]}


def _jwk(cose_b64: str) -> dict[str, Any]:
    from webauthn.helpers.decode_credential_public_key import (
        DecodedEC2PublicKey,
        DecodedOKPPublicKey,
        DecodedRSAPublicKey,
        decode_credential_public_key,
    )

    key = decode_credential_public_key(from_b64url(cose_b64))
    if isinstance(key, DecodedEC2PublicKey):
        return {"kty": "EC", "crv": "P-256", "alg": "ES256", "x": b64url(key.x),
                "y": b64url(key.y)}
    if isinstance(key, DecodedOKPPublicKey):
        return {"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "x": b64url(key.x)}
    if isinstance(key, DecodedRSAPublicKey):
        return {"kty": "RSA", "alg": "RS256", "n": b64url(key.n), "e": b64url(key.e)}
    return {"kty": "COSE", "alg": str(int(key.alg))}  # registration offers no other kind
