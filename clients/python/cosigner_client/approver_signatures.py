"""Check a permit's signed approvers against the tenant's approver keys (extra
``cosigner-client[jwks]``, for ``cryptography``).

A review signed with an approver's passkey (README § Signed approvals) puts a ``signature``
in the permit's ``approvers`` entry: the credential id, the digest of the review statement
(the WebAuthn challenge), the statement's time and the WebAuthn assertion (authenticator
data, client data JSON, signature; base64url). :func:`verify_approver_signatures`
recomputes the statement from the permit's own claims (tenant, approval id, tool, args
hash, policy, the approver's subject, decision ``approve``), and checks, for each signed
approver: the key (``kid`` = credential id) is in the export and belongs to that subject,
and was not removed before the statement's time; the digest matches; the client data is a
``webauthn.get`` over that digest from the export's ``origin``; the authenticator data names
the RP id with user presence and verification; the signature verifies over
``authenticatorData || SHA-256(clientDataJSON)`` (W3C WebAuthn Level 3 §7.2). So an
executor need not trust the server's permit signature alone for who approved.

``keys`` is ``GET /v1/approvers/keys`` of the permit's tenant (fetch it with the tenant's
credential; :func:`fetch_approver_keys`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import httpx
import rfc8785

try:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
except ImportError as exc:  # pragma: no cover - depends on the installed extra
    raise ImportError("install cosigner-client[jwks] to check approver signatures") from exc

__all__ = ["ApproverSignatureError", "fetch_approver_keys", "verify_approver_signatures"]

UP, UV = 0x01, 0x04


class ApproverSignatureError(Exception):
    """A signed approver that does not verify; ``code`` is ``unknown_credential`` or
    ``bad_approver_signature`` (or ``signature_missing`` when all were required);
    ``approver`` the subject."""

    def __init__(self, code: str, approver: str, detail: str) -> None:
        super().__init__(f"{code}: {approver}: {detail}")
        self.code, self.approver, self.detail = code, approver, detail


def fetch_approver_keys(base_url: str, api_key: str, *, timeout_s: float = 10.0
                        ) -> dict[str, Any]:
    """``GET /v1/approvers/keys`` of the key's tenant."""
    response = httpx.get(base_url.rstrip("/") + "/v1/approvers/keys", timeout=timeout_s,
                         headers={"Authorization": f"Bearer {api_key}"})
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


def _b64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise ValueError("not a base64url string")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not base64url") from exc


def _b64text(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _time(text: Any) -> datetime:
    return datetime.fromisoformat(str(text).replace("Z", "+00:00"))


def verify_approver_signatures(claims: Mapping[str, Any], keys: Mapping[str, Any], *,
                               require: bool = False) -> list[str]:
    """Check every signed approver of a permit's (already verified) ``claims``.

    Returns the subjects whose signatures verified (each once: a permit naming a signed
    approver twice is ``bad_approver_signature``). ``require``: every approver must be
    signed, and there must be at least one (a permit naming no approver is
    ``signature_missing``). Raises :class:`ApproverSignatureError` on the first that does
    not verify.
    """
    verified: list[str] = []
    by_kid = {k.get("kid"): k for k in keys.get("keys", []) if isinstance(k, Mapping)}
    if require and not claims.get("approvers"):
        raise ApproverSignatureError("signature_missing", "", "the permit names no approver")
    approvers = claims.get("approvers") or []
    if not isinstance(approvers, list):
        raise ApproverSignatureError("bad_approver_signature", "", "approvers is not a list")
    for approver in approvers:
        if not isinstance(approver, Mapping):
            raise ApproverSignatureError("bad_approver_signature", "",
                                         "an approvers entry is not an object")
        subject = str(approver.get("id"))
        if subject in verified:  # the server names each person once (one person, one count)
            raise ApproverSignatureError("bad_approver_signature", subject,
                                         "the permit names this approver twice")
        signed = approver.get("signature")
        if signed is None:
            if require:
                raise ApproverSignatureError("signature_missing", subject, "not signed")
            continue
        if not isinstance(signed, Mapping):
            raise ApproverSignatureError("bad_approver_signature", subject,
                                         "the signature is not an object")
        key = by_kid.get(signed.get("credential_id"))
        if key is None or key.get("sub") != subject:
            raise ApproverSignatureError("unknown_credential", subject,
                                         "no such credential of this approver")
        try:
            _check(claims, subject, signed, key, keys)
        except (ValueError, KeyError, TypeError, InvalidSignature) as exc:
            raise ApproverSignatureError("bad_approver_signature", subject,
                                         str(exc) or "signature does not verify") from exc
        verified.append(subject)
    return verified


def _check(claims: Mapping[str, Any], subject: str, signed: Mapping[str, Any],
           key: Mapping[str, Any], keys: Mapping[str, Any]) -> None:
    if key.get("removed_at") and _time(key["removed_at"]) <= _time(signed["time"]):
        raise ValueError("the credential was removed before this review")
    policy = claims.get("policy") or {}
    statement = {"type": "cosigner.review.v1", "tenant": claims["tenant"],
                 "approval_id": claims["approval_id"], "tool": claims["tool"],
                 "args_hash": claims["args_hash"], "decision": "approve",
                 "policy": {"id": str(policy.get("id", "")),
                            "version": str(policy.get("version", "")),
                            "revision": str(policy.get("revision", ""))},
                 "reviewer": subject, "time": signed["time"]}
    digest = hashlib.sha256(rfc8785.dumps(statement)).digest()
    if _b64text(digest) != signed["statement_digest"]:
        raise ValueError("the statement digest does not match the permit")
    client_json = _b64(signed["client_data_json"])
    client = json.loads(client_json)
    if client.get("type") != "webauthn.get" or _b64(client.get("challenge")) != digest:
        raise ValueError("the client data does not sign this statement")
    if client.get("origin") != keys.get("origin"):
        raise ValueError("the client data names another origin")
    auth_data = _b64(signed["authenticator_data"])
    rp_id = str(keys.get("rp_id", ""))
    if len(auth_data) < 37 or auth_data[:32] != hashlib.sha256(rp_id.encode()).digest():
        raise ValueError("the authenticator data names another RP id")
    if auth_data[32] & (UP | UV) != (UP | UV):
        raise ValueError("user presence or verification missing")
    _verify(key, _b64(signed["signature"]), auth_data + hashlib.sha256(client_json).digest())


def _verify(key: Mapping[str, Any], signature: bytes, data: bytes) -> None:
    kty = key.get("kty")
    if kty == "EC" and key.get("crv") == "P-256":
        point = ec.EllipticCurvePublicNumbers(int.from_bytes(_b64(key["x"]), "big"),
                                              int.from_bytes(_b64(key["y"]), "big"),
                                              ec.SECP256R1()).public_key()
        point.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    elif kty == "OKP" and key.get("crv") == "Ed25519":
        Ed25519PublicKey.from_public_bytes(_b64(key["x"])).verify(signature, data)
    elif kty == "RSA":
        public = rsa.RSAPublicNumbers(int.from_bytes(_b64(key["e"]), "big"),
                                      int.from_bytes(_b64(key["n"]), "big")).public_key()
        public.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
    else:
        raise ValueError(f"unsupported key type {kty!r}")
