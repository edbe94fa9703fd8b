"""``decisions.response`` of an allow stored as the facts it is built from (form 8).

An ``allow`` answer that :func:`cosigner.decisions.plan.DecisionPlan.prepared` builds is a
fixed template filled with a few facts: the row's own texts (decision id, request id,
args hash, policy revision, run id: :data:`cosigner.db.response_row.REF_COLUMNS`), the
policy's reasons, and the permit's issuer, audience, key id, tenant, tool, jti, issue time,
lifetime and 64-byte Ed25519 signature. Form 8 stores those facts and nothing else; the
answer, the token's header (RFC 7515 §4) and its claims (RFC 7519 §4.1) are rebuilt from
them with :mod:`orjson`, byte for byte.

Layout after the format byte ``8``: seven texts (issuer, audience, kid, tenant, tool,
policy id, policy version), each a one-byte length (0..254) and its UTF-8 bytes, or the
byte ``0xFF`` alone for the format's own spelling of it (:data:`SPELLED`: the issuer
``cosigner`` and the audience ``cosigner-executor``, constants of this format whatever the
settings' defaults become); the effect is ``allow`` (the only one stored this way); the
reasons as compact JSON after a two-byte big-endian length; the jti's 16 bytes (it is 32
lower-case hex digits); ``iat`` as a signed 64-bit and ``exp - iat`` as an unsigned 32-bit
big-endian integer; the signature's 64 bytes.

Exactness: :func:`pack` builds the form, rebuilds the answer's parts from it
(:func:`parts_of`, the reader's code) and keeps it only when all four equal the parts the
writer holds, else answers ``None`` (the caller then stores form 7). A value that does not
fit the template (an approval, a standing approval's claim, a jti that is not hex, a text
of 255 bytes or more) is therefore never misread; it is stored as before. No compression runs:
250 bytes for the bench's allow against form 7's ~323 (8 decision rows in a 4 KB page
instead of 7), and ~10 µs to write (half of it the check) against ~23; in process an
allow costs ~13 µs less CPU (bench/README.md, session 14).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import orjson

from cosigner.core.clock import expiry_of
from cosigner.db.compressed import V8_FACTS

_PREFIX = bytes([V8_FACTS])
_NUMBERS = struct.Struct(">16sqI")
_REASONS = struct.Struct(">H")
_SIGNATURE = 64
#: The seven texts of the layout, in order.
_TEXTS = 7
#: Texts a single ``0xFF`` byte stands for, by place in the layout (issuer, audience): the
#: spellings most servers sign with, kept out of every row. Part of the format: never
#: changed (a new spelling needs a new format byte).
SPELLED: dict[int, str] = {0: "cosigner", 1: "cosigner-executor"}
_SPELLED_BYTES = {place: text.encode() for place, text in SPELLED.items()}
_AS_SPELLED = 0xFF
_AS_SPELLED_BYTE = bytes([_AS_SPELLED])
_EFFECT = "allow"


def pack(value: dict[str, Any], parts: tuple[bytes, bytes, bytes, bytes],
         refs: Sequence[str | None]) -> bytes | None:
    """Form 8 of the allow answer ``value`` whose :func:`~cosigner.db.compressed.response_parts`
    are ``parts`` (answer with an empty token, header, claims, signature), given its row's
    reference texts; ``None`` when the answer is not the template's (module docstring)."""
    answer, header, claims, signature = parts
    if len(signature) != _SIGNATURE or value.get("effect") != _EFFECT:
        return None
    try:
        head = orjson.loads(header)
        stated = orjson.loads(claims)
        policy = value["policy"]
        jti = bytes.fromhex(stated["jti"])
        texts = (stated["iss"], stated["aud"], head["kid"], stated["tenant"], stated["tool"],
                 policy["id"], policy["version"])
        reasons = orjson.dumps(value["reasons"])
        iat, exp = stated["iat"], stated["exp"]
        packed = [_PREFIX]
        for place, text in enumerate(texts):
            raw = text.encode()
            if raw == _SPELLED_BYTES.get(place):
                packed.append(_AS_SPELLED_BYTE)
            elif len(raw) < _AS_SPELLED:
                packed += (bytes([len(raw)]), raw)
            else:
                return None  # 255 bytes and more: not this form
        packed += (_REASONS.pack(len(reasons)), reasons,
                   _NUMBERS.pack(jti, iat, exp - iat), signature)
    except (KeyError, TypeError, AttributeError, ValueError, OverflowError, struct.error,
            orjson.JSONDecodeError):
        return None  # not the template's shape
    stored = b"".join(packed)
    try:
        if parts_of(stored, refs) != parts:
            return None
    except ValueError:
        return None
    return stored


def parts_of(stored: bytes, refs: Sequence[str | None]) -> tuple[bytes, bytes, bytes, bytes]:
    """``(answer with an empty token, header, claims, signature)`` of a form 8 value, given
    its row's :data:`~cosigner.db.response_row.REF_COLUMNS` texts (the bytes form 7's body
    holds).

    Raises:
        ValueError: not form 8, damaged (short, lengths past its end, a text that is not
            UTF-8, trailing bytes), or a reference text missing from the row.
    """
    if stored[:1] != _PREFIX:
        raise ValueError("not a form 8 response")
    decision_id, request_id, args_hash, revision, run_id = refs
    if decision_id is None or request_id is None or args_hash is None or revision is None \
            or run_id is None:
        raise ValueError("a form 8 response refers to a column its row does not hold")
    at, texts = 1, []
    try:
        for place in range(_TEXTS):
            size = stored[at]
            if size == _AS_SPELLED:
                texts.append(SPELLED[place])  # KeyError: no spelling at this place
                at += 1
                continue
            texts.append(stored[at + 1:at + 1 + size].decode())
            at += 1 + size
        (size,) = _REASONS.unpack_from(stored, at)
        reasons = stored[at + 2:at + 2 + size]
        at += 2 + size
        jti, iat, ttl = _NUMBERS.unpack_from(stored, at)
        at += _NUMBERS.size
    except (IndexError, KeyError, UnicodeDecodeError, struct.error) as exc:
        raise ValueError("damaged form 8 response") from exc
    signature = stored[at:]
    if len(signature) != _SIGNATURE or len(reasons) != size:
        raise ValueError("damaged form 8 response")
    issuer, audience, kid, tenant, tool, policy_id, version = texts
    policy = {"id": policy_id, "version": version, "revision": revision}
    exp = iat + ttl
    jti_hex = jti.hex()
    claims = orjson.dumps({
        "iss": issuer, "aud": audience, "jti": jti_hex, "iat": iat, "nbf": iat, "exp": exp,
        "tenant": tenant, "run": run_id, "decision_id": decision_id, "tool": tool,
        "args_hash": args_hash, "policy": policy, "approvers": []})
    header = orjson.dumps({"alg": "Ed25519", "kid": kid, "typ": PERMIT_TYP})
    try:
        expires = expiry_of(exp)[1]
        answer = orjson.dumps({
            "decision_id": decision_id, "request_id": request_id, "effect": _EFFECT,
            "reasons": orjson.Fragment(reasons), "policy": policy, "args_hash": args_hash,
            "permit": {"token": "", "jti": jti_hex, "expires_at": expires},
            "approval": None})
    except (OverflowError, OSError, ValueError, orjson.JSONEncodeError) as exc:
        raise ValueError("damaged form 8 response") from exc
    return answer, header, claims, signature


#: The permit header's ``typ`` (:data:`cosigner.permits.tokens.PERMIT_TYP`, which tests
#: compare with this; db/ does not import permits/).
PERMIT_TYP = "cosigner-permit+jwt"
