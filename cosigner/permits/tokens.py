"""Permits: signed, single-use tokens that let one exact tool call run.

A permit is a compact JWS (see :mod:`cosigner.keys.keyring`, ``typ``
:data:`PERMIT_TYP`) whose claims bind it to one tenant, one tool and one canonical args
hash (invariant 3). This module mints and verifies the token; redeeming it (single use,
revocation, policy re-evaluation) is the redeem use case's job.

Time: every claim is an integer NumericDate (seconds since the epoch, UTC). ``now`` is floored to
whole seconds before any comparison, which is exact for integer claims: ``now >= exp`` holds for
the floored value iff it holds for the real instant. No clock-skew leeway is granted.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, NotRequired, TypedDict

from cosigner.core.clock import numeric_date
from cosigner.core.errors import PermitRefused
from cosigner.core.ids import new_hex_id
from cosigner.db import compressed
from cosigner.keys.keyring import MAX_TOKEN_CHARS, Keyring, decode_payload

__all__ = [
    "PERMIT_TYP",
    "ApproverRef",
    "PermitClaims",
    "PolicyRef",
    "check_binding",
    "mint_permit",
    "stated_claims",
    "token_digest",
    "verify_permit_token",
]

PERMIT_TYP = "cosigner-permit+jwt"



class PolicyRef(TypedDict):
    """The policy that allowed the call: bundle id, version and revision (content digest)."""

    id: str
    version: str
    revision: str


class ApproverRef(TypedDict):
    """One accepted review: approver subject id, the role it counted for, and when (NumericDate);
    ``signature`` for a signed review (:data:`SIGNATURE_MEMBERS`, base64url strings but
    ``time``, RFC 3339)."""

    id: str
    role: str
    at: int
    signature: NotRequired[dict[str, str]]


#: Members of an approver's ``signature``: the credential, the statement digest (the
#: WebAuthn challenge), the statement's time and the assertion (cosigner.approvals.signatures).
SIGNATURE_MEMBERS = ("credential_id", "statement_digest", "time", "authenticator_data",
                     "client_data_json", "signature")


class PermitClaims(NamedTuple):
    """The claims of a permit, exactly as signed. Times are NumericDate ints (UTC seconds)."""

    iss: str
    aud: str
    jti: str
    iat: int
    nbf: int
    exp: int
    tenant: str
    run: str
    decision_id: str
    approval_id: str | None
    tool: str
    args_hash: str
    policy: PolicyRef
    approvers: tuple[ApproverRef, ...]
    #: Authorised by one ``breakglass`` principal, not by the requirement's quorum.
    break_glass: bool = False
    #: Allowed by this standing approval (cosigner.approvals.standing), not by a review.
    standing_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JWT claims set (``approval_id`` omitted when there is none)."""
        (iss, aud, jti, iat, nbf, exp, tenant, run, decision_id, approval_id, tool,
         args_hash, policy, approvers, break_glass, standing_id) = self
        if approval_id is None:
            claims: dict[str, Any] = {
                "iss": iss, "aud": aud, "jti": jti, "iat": iat, "nbf": nbf, "exp": exp,
                "tenant": tenant, "run": run, "decision_id": decision_id, "tool": tool,
                "args_hash": args_hash, "policy": dict(policy),
                "approvers": [dict(approver) for approver in approvers] if approvers else []}
        else:
            claims = {
                "iss": iss, "aud": aud, "jti": jti, "iat": iat, "nbf": nbf, "exp": exp,
                "tenant": tenant, "run": run, "decision_id": decision_id,
                "approval_id": approval_id, "tool": tool, "args_hash": args_hash,
                "policy": dict(policy),
                "approvers": [dict(approver) for approver in approvers]}
        if break_glass:
            claims["break_glass"] = True
        if standing_id is not None:
            claims["standing_id"] = standing_id
        return claims


def mint_permit(
    keyring: Keyring,
    *,
    issuer: str,
    audience: str,
    tenant: str,
    run_id: str,
    decision_id: str,
    approval_id: str | None,
    tool: str,
    args_hash: str,
    policy: Mapping[str, str],
    approvers: Sequence[Mapping[str, Any]],
    now: datetime,
    ttl_s: int,
    jti: str | None = None,
    break_glass: bool = False,
    standing_id: str | None = None,
) -> tuple[str, PermitClaims]:
    """Sign a permit valid from ``now`` (floored to seconds) for ``ttl_s`` seconds.

    ``policy`` holds ``id``, ``version``, ``revision`` (strings). Each approver holds ``id``,
    ``role`` and ``at`` (aware datetime or NumericDate int). ``jti`` defaults to a
    time-ordered UUIDv7 in hex (:mod:`cosigner.core.ids`). The token's decoded segments
    are remembered for its storage (:func:`cosigner.db.compressed.remember_token`).

    Raises:
        ValueError: ``ttl_s`` not in ``1..keyring.max_token_lifetime_s`` (a longer permit could
            outlive its key's publication after rotation), or a malformed policy/approver.
    """
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int):
        raise TypeError("ttl_s must be an int")
    if not 0 < ttl_s <= keyring.max_token_lifetime_s:
        raise ValueError(f"ttl_s must be in 1..{keyring.max_token_lifetime_s}")
    iat = numeric_date(now)
    # Positional, in the field order (a NamedTuple's keyword call costs more per field).
    claims = PermitClaims(
        issuer, audience, jti if jti is not None else new_hex_id(), iat, iat, iat + ttl_s,
        tenant, run_id, decision_id, approval_id, tool, args_hash,
        _policy_ref(policy, error=ValueError),
        tuple(_approver_ref(approver, error=ValueError, accept_datetime=True)
              for approver in approvers) if approvers else (),
        break_glass, standing_id)
    # The claims ride with the signature in the keyring's memo: a redeem of this token by
    # this process gets them back instead of decoding and parsing its payload again.
    token, header, payload, signature = keyring.sign_parts(
        claims.to_json(), typ=PERMIT_TYP, attach=claims if _parses_as_itself(claims) else None)
    # Stored decoded beside its decision (cosigner.db.compressed, form 2/3): the bytes
    # are at hand here, so the store need not decode the token and spell it again.
    compressed.remember_token(token, header, payload, signature)
    return token, claims


def token_digest(token: str) -> bytes:
    """The 16 bytes a permit's row keeps of its token: SHA-256 (FIPS 180-4) of the compact
    token's ASCII text, first 128 bits. A presented token with this digest is the minted
    token itself (finding another text with the same 128 bits is a second preimage of
    SHA-256 truncated to 128 bits, ~2^128 work; the signature the attacker cannot
    predict rules out a chosen-collision pair), so its signature is the one this server
    made (cosigner.permits.redeem).

    Raises:
        UnicodeEncodeError: ``token`` is not ASCII (no compact JWS is).
    """
    return hashlib.sha256(token.encode("ascii")).digest()[:16]


def stated_claims(token: str) -> PermitClaims | None:
    """The claims a compact token's payload states, parsed as :func:`verify_permit_token`
    parses them but **not verified** (no header, signature or time check): ``None`` when
    it is not three segments or its payload does not parse. Only for finding the row a
    token names before verifying it (cosigner.permits.redeem)."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
        return None
    segments = token.split(".")
    if len(segments) != 3:
        return None
    try:
        return _parse_claims(decode_payload(segments[1]))
    except PermitRefused:
        return None


def verify_permit_token(
    keyring: Keyring, token: str, *, now: datetime, issuer: str, audience: str,
    minted: Callable[[PermitClaims], bool] | None = None,
    stated: PermitClaims | None = None,
) -> PermitClaims:
    """Check a permit's signature, claim types, issuer, audience and validity window.

    ``now`` is floored to whole seconds. Expired when ``now >= exp`` (RFC 7519 §4.1.4: not
    accepted *on or after* exp); not yet valid when ``now < nbf`` (§4.1.5).

    ``minted``: asked with the claims the payload states (parsed, not yet trusted) when
    this process's memo does not hold the signature; ``True`` when the server's own
    record shows this exact token was minted (its row's :func:`token_digest` equals the
    token's), and the Ed25519 check (~45–75 µs) is then skipped: the signature is the
    one the server made. Every other check runs either way, in the same order, so a
    token it does not vouch for is refused exactly as without it. What it raises
    propagates (a database error: the caller's 503). ``stated``: :func:`stated_claims`
    of this same ``token``, when the caller has it, so the payload is not parsed again.

    Raises:
        PermitRefused: codes from :meth:`Keyring.verify`, plus ``malformed_permit`` (a claim
            missing or of the wrong JSON type: times must be integers, not bool/float/string),
            ``bad_signature`` (issuer is not us), ``wrong_audience``, ``expired``,
            ``not_yet_valid``.
    """
    vouch: Callable[[str], object] | None = None
    if minted is not None:
        def vouch(payload: str) -> PermitClaims | None:
            claims = stated
            if claims is None:
                try:
                    claims = _parse_claims(decode_payload(payload))
                except PermitRefused:
                    return None  # the signature check decides, then the payload's error
            return claims if minted(claims) else None

    # A token this process minted comes back with its claims (see _parses_as_itself).
    raw = keyring.verify_recalled(token, typ=PERMIT_TYP, kind=PermitClaims, now=now,
                                  vouch=vouch)
    claims = raw if isinstance(raw, PermitClaims) else _parse_claims(raw)
    if claims.iss != issuer:
        raise PermitRefused("permit was not issued by this server", code="bad_signature")
    if claims.aud != audience:
        raise PermitRefused("permit is meant for another audience", code="wrong_audience")
    current = numeric_date(now)
    if current >= claims.exp:
        raise PermitRefused("permit has expired", code="expired")
    if current < claims.nbf:
        raise PermitRefused("permit is not valid yet", code="not_yet_valid")
    return claims


def check_binding(claims: PermitClaims, *, tenant: str, tool: str, args_hash: str) -> None:
    """Refuse a permit used for another tenant, tool or argument set (invariant 3).

    Raises:
        PermitRefused: ``tenant_mismatch``, ``tool_mismatch`` or ``args_mismatch``.
    """
    if claims.tenant != tenant:
        raise PermitRefused("permit belongs to another tenant", code="tenant_mismatch")
    if claims.tool != tool:
        raise PermitRefused("permit is for another tool", code="tool_mismatch")
    if not hmac.compare_digest(claims.args_hash.encode(), args_hash.encode()):
        raise PermitRefused("arguments differ from the approved ones", code="args_mismatch")


# --- claim parsing ----------------------------------------------------------------------


def _malformed(detail: str) -> PermitRefused:
    return PermitRefused(detail, code="malformed_permit")


def _str(raw: Mapping[str, Any], name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str) or not value:
        raise _malformed(f"claim {name!r} missing or not a string")
    return value


def _int(raw: Mapping[str, Any], name: str) -> int:
    value = raw.get(name)
    # bool is an int subclass; floats and numeric strings are refused, not coerced (K18).
    if type(value) is not int:
        raise _malformed(f"claim {name!r} missing or not an integer")
    return value


def _policy_ref(raw: Any, *, error: Callable[[str], Exception]) -> PolicyRef:
    if type(raw) is dict:  # the common case in one step; anything else: the checks below
        ref_id, version, revision = raw.get("id"), raw.get("version"), raw.get("revision")
        if (type(ref_id) is str and ref_id and type(version) is str and version
                and type(revision) is str and revision):
            return PolicyRef(id=ref_id, version=version, revision=revision)
    if not isinstance(raw, Mapping):
        raise error("policy must be an object")
    fields: dict[str, str] = {}
    for name in ("id", "version", "revision"):
        value = raw.get(name)
        if not isinstance(value, str) or not value:
            raise error(f"policy.{name} missing or not a string")
        fields[name] = value
    return PolicyRef(id=fields["id"], version=fields["version"], revision=fields["revision"])


def _approver_ref(
    raw: Any, *, error: Callable[[str], Exception], accept_datetime: bool = False
) -> ApproverRef:
    if not isinstance(raw, Mapping):
        raise error("approver must be an object")
    approver_id, role, at = raw.get("id"), raw.get("role"), raw.get("at")
    if not isinstance(approver_id, str) or not approver_id:
        raise error("approver id missing or not a string")
    if not isinstance(role, str) or not role:
        raise error("approver role missing or not a string")
    if accept_datetime and isinstance(at, datetime):
        at = numeric_date(at)
    if type(at) is not int:
        raise error("approver 'at' missing or not an integer")
    ref = ApproverRef(id=approver_id, role=role, at=at)
    signature = raw.get("signature")
    if signature is not None:
        if not isinstance(signature, Mapping) or set(signature) != set(SIGNATURE_MEMBERS) or \
                not all(isinstance(v, str) and v for v in signature.values()):
            raise error("approver 'signature' is not a signed-review reference")
        ref["signature"] = {k: signature[k] for k in SIGNATURE_MEMBERS}
    return ref


def _parses_as_itself(claims: PermitClaims) -> bool:
    """True when :func:`_parse_claims` of ``claims.to_json()`` as JSON (what
    :func:`verify_permit_token` reads back from the token) is ``claims`` itself, value for
    value and type for type: every string claim a non-empty ``str`` (not a subclass), the
    times ``int``, ``break_glass`` a ``bool``, optional ids absent or non-empty, and the
    policy and approvers of exact ``str`` members (ints for ``at``). Anything else is left
    to the parser (tests/permits/test_tokens.py checks both ways with hypothesis)."""
    (iss, aud, jti, iat, nbf, exp, tenant, run, decision_id, approval_id, tool,
     args_hash, policy, approvers, break_glass, standing_id) = claims
    for text in (iss, aud, jti, tenant, run, decision_id, tool, args_hash):
        if type(text) is not str or not text:
            return False
    if type(iat) is not int or type(nbf) is not int or type(exp) is not int:
        return False
    if type(break_glass) is not bool:
        return False
    for optional in (approval_id, standing_id):
        if optional is not None and (type(optional) is not str or not optional):
            return False
    if type(policy) is not dict or len(policy) != 3:
        return False
    for name in ("id", "version", "revision"):
        value = policy.get(name)
        if type(value) is not str or not value:
            return False
    return not approvers or all(_approver_as_itself(approver) for approver in approvers)


def _approver_as_itself(approver: Mapping[str, Any]) -> bool:
    if type(approver) is not dict:
        return False
    signature = approver.get("signature")
    if len(approver) != (3 if signature is None else 4):
        return False
    approver_id, role, at = approver.get("id"), approver.get("role"), approver.get("at")
    if type(approver_id) is not str or not approver_id or type(role) is not str or not role \
            or type(at) is not int:
        return False
    return signature is None or (
        type(signature) is dict and list(signature) == list(SIGNATURE_MEMBERS)
        and all(type(value) is str and value for value in signature.values()))


def _parse_claims(raw: Mapping[str, Any]) -> PermitClaims:
    approval_id = raw.get("approval_id")
    if approval_id is not None and (not isinstance(approval_id, str) or not approval_id):
        raise _malformed("claim 'approval_id' is not a string")
    approvers = raw.get("approvers")
    if not isinstance(approvers, list):
        raise _malformed("claim 'approvers' missing or not an array")
    break_glass = raw.get("break_glass", False)
    if not isinstance(break_glass, bool):
        raise _malformed("claim 'break_glass' is not a boolean")
    standing_id = raw.get("standing_id")
    if standing_id is not None and (not isinstance(standing_id, str) or not standing_id):
        raise _malformed("claim 'standing_id' is not a string")
    return PermitClaims(
        iss=_str(raw, "iss"),
        aud=_str(raw, "aud"),
        jti=_str(raw, "jti"),
        iat=_int(raw, "iat"),
        nbf=_int(raw, "nbf"),
        exp=_int(raw, "exp"),
        tenant=_str(raw, "tenant"),
        run=_str(raw, "run"),
        decision_id=_str(raw, "decision_id"),
        approval_id=approval_id,
        tool=_str(raw, "tool"),
        args_hash=_str(raw, "args_hash"),
        policy=_policy_ref(raw.get("policy"), error=_malformed),
        approvers=tuple(_approver_ref(item, error=_malformed) for item in approvers),
        break_glass=break_glass,
        standing_id=standing_id,
    )
