"""Signed review statements: what an approver's passkey signs, and how it is checked.

A review statement is a JSON object naming exactly what is decided::

    {"type": "cosigner.review.v1", "tenant": str, "approval_id": str, "tool": str,
     "args_hash": "sha256:<hex>", "decision": "approve" | "reject",
     "policy": {"id": str, "version": str, "revision": str},
     "reviewer": <canonical subject>, "time": "<RFC 3339 UTC>"}

Its digest (SHA-256 of its RFC 8785 canonical form, 32 bytes) is the WebAuthn challenge
(W3C WebAuthn Level 3 §13.4.3): the authenticator's assertion over it binds the person's
credential to these exact arguments. :func:`check_assertion` verifies an assertion with the
py_webauthn library (client data type ``webauthn.get``, challenge = the digest, origin, RP
id hash, user presence *and* verification, sign counter, signature over
``authenticatorData || SHA-256(clientDataJSON)``), so the server, ``cosigner audit verify``
and an executor run the same check. Pure: no database, no clock.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from cosigner.core.canonical import canonicalize

STATEMENT_TYPE = "cosigner.review.v1"
#: ``approved``/``rejected`` (review decisions) as the statement spells them.
STATEMENT_DECISIONS = {"approved": "approve", "rejected": "reject"}
#: ``signature`` values an approval requirement may ask for.
SIGNATURE_KINDS = frozenset({"webauthn"})
#: Authentication methods that can never produce a signed review (no person's authenticator
#: in the loop): an API key is a program, a Slack click carries no assertion.
UNSIGNABLE_METHODS = frozenset({"api_key", "slack"})


class SignatureCheckError(ValueError):
    """An assertion that does not verify; ``code`` is the refusal code."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


def b64url(data: bytes) -> str:
    """Unpadded base64url (RFC 4648 §5), as WebAuthn's JSON encodings use."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def from_b64url(text: str) -> bytes:
    """Bytes of unpadded (or padded) base64url; raises ``ValueError``."""
    if not isinstance(text, str):
        raise ValueError("not a base64url string")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not base64url") from exc


def review_statement(*, tenant: str, approval_id: str, tool: str, args_hash: str,
                     decision: str, policy: dict[str, Any] | None, reviewer: str,
                     time: str) -> dict[str, Any]:
    """The statement a reviewer signs. ``decision`` is ``approved``/``rejected`` (or already
    ``approve``/``reject``); ``reviewer`` the canonical subject; ``time`` RFC 3339 UTC."""
    policy = policy or {}
    return {"type": STATEMENT_TYPE, "tenant": tenant, "approval_id": approval_id,
            "tool": tool, "args_hash": args_hash,
            "decision": STATEMENT_DECISIONS.get(decision, decision),
            "policy": {"id": str(policy.get("id", "")),
                       "version": str(policy.get("version", "")),
                       "revision": str(policy.get("revision", ""))},
            "reviewer": reviewer, "time": time}


def statement_digest(statement: dict[str, Any]) -> bytes:
    """SHA-256 of the statement's RFC 8785 canonical bytes (32 bytes): the challenge."""
    return hashlib.sha256(canonicalize(statement)).digest()


@dataclass(frozen=True, slots=True)
class Assertion:
    """A WebAuthn assertion (``navigator.credentials.get()``'s response), bytes decoded."""

    credential_id: str  # base64url
    authenticator_data: bytes
    client_data_json: bytes
    signature: bytes

    @classmethod
    def parse(cls, raw: Any) -> Assertion:
        """From the browser's JSON (``{id, rawId, type, response: {authenticatorData,
        clientDataJSON, signature}}``, base64url members) or from :meth:`record`'s shape.

        Raises:
            SignatureCheckError: ``signature_invalid`` — not an assertion.
        """
        try:
            if isinstance(raw, str):
                raw = json.loads(raw)
            if not isinstance(raw, dict):
                raise ValueError("not an object")
            if "response" in raw:
                response = raw["response"]
                if raw.get("type", "public-key") != "public-key" or not isinstance(
                        response, dict) or raw.get("rawId", raw.get("id")) != raw.get("id"):
                    raise ValueError("not a public-key credential")
                parts = (raw["id"], response["authenticatorData"],
                         response["clientDataJSON"], response["signature"])
            else:
                parts = (raw["credential_id"], raw["authenticator_data"],
                         raw["client_data_json"], raw["signature"])
            credential_id = b64url(from_b64url(parts[0]))
            return cls(credential_id, from_b64url(parts[1]), from_b64url(parts[2]),
                       from_b64url(parts[3]))
        except (KeyError, TypeError, ValueError) as exc:
            raise SignatureCheckError("signature_invalid", "not a WebAuthn assertion") from exc

    def record(self) -> dict[str, str]:
        """The stored form (review events, permits): base64url members."""
        return {"credential_id": self.credential_id,
                "authenticator_data": b64url(self.authenticator_data),
                "client_data_json": b64url(self.client_data_json),
                "signature": b64url(self.signature)}

    def client_challenge(self) -> bytes | None:
        """The challenge the client data names (``None`` when unreadable)."""
        try:
            data = json.loads(self.client_data_json)
            return from_b64url(data["challenge"]) if isinstance(data, dict) else None
        except (KeyError, TypeError, ValueError):
            return None


def check_assertion(assertion: Assertion, *, public_key: bytes, digest: bytes, rp_id: str,
                    origin: str, sign_count: int = 0) -> int:
    """Verify ``assertion`` over ``digest`` with the credential's COSE ``public_key``.

    ``sign_count``: the counter stored for the credential (0 offline: the counter is then
    only checked by the server). Returns the authenticator's new counter.

    Raises:
        SignatureCheckError: ``signature_challenge_mismatch`` (client data names another
            challenge), ``signature_replayed`` (counter not above ``sign_count``),
            ``signature_invalid`` (anything else: type, origin, RP id, user presence or
            verification, signature).
    """
    from webauthn import verify_authentication_response
    from webauthn.helpers import parse_authenticator_data
    from webauthn.helpers.exceptions import InvalidAuthenticationResponse

    if assertion.client_challenge() != digest:
        raise SignatureCheckError("signature_challenge_mismatch",
                                  "the assertion signs another statement")
    try:
        counter = parse_authenticator_data(assertion.authenticator_data).sign_count
    except Exception as exc:  # the library raises several kinds on malformed bytes
        raise SignatureCheckError("signature_invalid", "malformed authenticator data") from exc
    if (counter or sign_count) and counter <= sign_count:
        raise SignatureCheckError("signature_replayed",
                                  "the authenticator's counter did not advance")
    raw_id = assertion.credential_id
    try:
        verified = verify_authentication_response(
            credential={"id": raw_id, "rawId": raw_id, "type": "public-key",
                        "response": {"authenticatorData": b64url(assertion.authenticator_data),
                                     "clientDataJSON": b64url(assertion.client_data_json),
                                     "signature": b64url(assertion.signature)}},
            expected_challenge=digest, expected_rp_id=rp_id, expected_origin=origin,
            credential_public_key=public_key, credential_current_sign_count=sign_count,
            require_user_verification=True)
    except InvalidAuthenticationResponse as exc:
        raise SignatureCheckError("signature_invalid", str(exc)) from exc
    except Exception as exc:  # undecodable key or signature: still a bad assertion
        raise SignatureCheckError("signature_invalid", "the assertion does not verify") from exc
    return int(verified.new_sign_count)
