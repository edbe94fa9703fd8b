"""Offline verification of a JSON Lines export (``cosigner audit verify``).

Trusts nothing but the JWKS it is given: recomputes every event hash (RFC 8785 + SHA-256),
checks each ``prev_hash`` link and ``seq`` continuity from the export's anchor, checks every
checkpoint's Ed25519 signature (``alg`` pinned, ``kid`` looked up in the JWKS only, ``typ``
``cosigner-checkpoint+jwt``) and that the signed ``{tenant, seq, hash}`` match the events.
The anchor must be the genesis (seq 0) or a signed checkpoint in the file.

Fault kinds, reported with the first bad ``seq``:

``edited``        an event's content differs from its hash, its link, or a signed checkpoint
``deleted``       an event is missing (a ``seq`` gap that never fills)
``inserted``      an event that is not part of the chain (a repeated ``seq``)
``reordered``     events out of ``seq`` order (the missing seq shows up later)
``truncated``     a checkpoint or the header names events beyond the last one present
``bad_checkpoint_signature``  a checkpoint whose signature, kid, alg or claims do not verify
``bad_anchor``    the anchor is neither the genesis nor a signed checkpoint
``malformed``     a line that is not a valid export record
``bad_approver_signature``  a signed review whose statement or WebAuthn assertion does not
                  verify against the key registered earlier in the log
``unknown_credential``      a signed review by a credential not registered (to that person)
                  earlier in the log, or removed before it
``missing_approver_signature``  an approval counted for a group asking for a signature
                  without one

Signed reviews are checked by :mod:`cosigner.audit.approver_signatures`, after the chain: a
rewritten review is caught there even when every chain hash was recomputed.

The file is read three times (checkpoints, the chain, signed reviews), one line at a time,
so memory stays flat for any size of export (but for the approver keys registered in it).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from cosigner.audit.approver_signatures import check_signed_reviews
from cosigner.audit.chain import GENESIS
from cosigner.audit.checkpoints import CHECKPOINT_TYP
from cosigner.audit.export import EXPORT_FORMAT
from cosigner.core.canonical import canonicalize, hash_bytes

LOOKAHEAD = 10_000
"""How many lines after a ``seq`` gap are searched for the missing event (reorder vs delete)."""


@dataclass(frozen=True, slots=True)
class Report:
    ok: bool
    events: int
    checkpoints: int
    first_seq: int | None = None
    last_seq: int | None = None
    bad_seq: int | None = None
    fault: str | None = None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "events": self.events, "checkpoints": self.checkpoints,
                "first_seq": self.first_seq, "last_seq": self.last_seq,
                "bad_seq": self.bad_seq, "fault": self.fault, "detail": self.detail}


class _Fault(Exception):
    def __init__(self, seq: int | None, fault: str, detail: str) -> None:
        super().__init__(detail)
        self.seq, self.fault, self.detail = seq, fault, detail


# --- checkpoint signatures ------------------------------------------------------------------


def _b64(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


#: The JWS ``alg`` names of an Ed25519 key (RFC 9864's, RFC 8037's); one per key.
_ALGS = ("Ed25519", "EdDSA")


def ed25519_keys(jwks: dict[str, Any]) -> dict[str, tuple[Ed25519PublicKey, str]]:
    """``kid → (public key, its alg)`` for the Ed25519 (OKP) keys of a JWK Set (``alg``
    ``Ed25519`` when the entry names none); others are ignored."""
    keys: dict[str, tuple[Ed25519PublicKey, str]] = {}
    for jwk in jwks.get("keys", []) if isinstance(jwks, dict) else []:
        if (isinstance(jwk, dict) and jwk.get("kty") == "OKP" and jwk.get("crv") == "Ed25519"
                and isinstance(jwk.get("kid"), str) and isinstance(jwk.get("x"), str)
                and jwk.get("alg", "Ed25519") in _ALGS):
            try:
                keys[jwk["kid"]] = (Ed25519PublicKey.from_public_bytes(_b64(jwk["x"])),
                                    jwk.get("alg", "Ed25519"))
            except (ValueError, binascii.Error):
                continue
    return keys


def verify_checkpoint_token(token: str, keys: dict[str, tuple[Ed25519PublicKey, str]]
                            ) -> dict[str, Any]:
    """The claims of a checkpoint JWS; raises ``ValueError`` naming what failed."""
    parts = token.split(".") if isinstance(token, str) else []
    if len(parts) != 3:
        raise ValueError("not a compact JWS")
    try:
        header = json.loads(_b64(parts[0]))
        claims = json.loads(_b64(parts[1]))
        signature = _b64(parts[2])
    except (binascii.Error, ValueError) as exc:
        raise ValueError("undecodable JWS") from exc
    if not isinstance(header, dict) or header.get("alg") not in _ALGS:
        raise ValueError("algorithm is not Ed25519")
    if header.get("typ") != CHECKPOINT_TYP:
        raise ValueError("not a checkpoint token")
    kid = header.get("kid")
    found = keys.get(kid) if isinstance(kid, str) else None
    if found is None:
        raise ValueError("kid not in the JWKS")
    key, alg = found
    if header["alg"] != alg:  # the key's own alg only (K17)
        raise ValueError(f"algorithm is not the key's own ({alg})")
    try:
        key.verify(signature, f"{parts[0]}.{parts[1]}".encode())
    except InvalidSignature as exc:
        raise ValueError("signature does not verify") from exc
    if not isinstance(claims, dict):
        raise ValueError("claims are not an object")
    return claims


# --- reading --------------------------------------------------------------------------------


_EVENT_PREFIX = '{"kind":"event","hash":"'
_BODY_AT = len(_EVENT_PREFIX) + 71  # "sha256:" + 64 hex digits
_BODY_MARK = '","body":'


def _fast_event(line: str) -> dict[str, Any] | None:
    """An event line exactly as the server writes it, whose raw body bytes hash to its
    ``hash``: then those bytes *are* the canonical bytes hashed at write time (SHA-256
    preimage resistance), so re-canonicalising can be skipped. ``None`` otherwise (the
    line is checked the slow way)."""
    if not line.startswith(_EVENT_PREFIX) or line[_BODY_AT:_BODY_AT + 9] != _BODY_MARK:
        return None
    text = line.rstrip("\r\n")
    if not text.endswith("}"):
        return None
    body_text = text[_BODY_AT + 9:-1]
    digest = line[len(_EVENT_PREFIX):_BODY_AT]
    if hash_bytes(body_text.encode()) != digest:
        return None
    try:
        body = json.loads(body_text)
    except ValueError:
        return None
    return {"kind": "event", "hash": digest, "body": body}


def _records(lines: Iterable[str], *, skip_events: bool = False
             ) -> Iterator[tuple[int, dict[str, Any], bool]]:
    """``(line number, record, hash already checked)`` for each non-blank line."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if line.startswith(_EVENT_PREFIX):
            if skip_events:
                continue
            fast = _fast_event(line)
            if fast is not None:
                yield number, fast, True
                continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise _Fault(None, "malformed", f"line {number} is not JSON") from exc
        if not isinstance(record, dict):
            raise _Fault(None, "malformed", f"line {number} is not an object")
        yield number, record, False


def _event_seq(record: dict[str, Any]) -> int | None:
    body = record.get("body")
    seq = body.get("seq") if isinstance(body, dict) else None
    return seq if isinstance(seq, int) else None


def _read_checkpoints(lines: Iterable[str], keys: dict[str, tuple[Ed25519PublicKey, str]]
                      ) -> tuple[dict[str, Any], dict[int, str]]:
    header: dict[str, Any] | None = None
    signed: dict[int, str] = {}
    for number, record, _ in _records(lines, skip_events=True):
        kind = record.get("kind")
        if header is None:
            if kind != "header" or record.get("format") != EXPORT_FORMAT:
                raise _Fault(None, "malformed", "the first line is not an export header")
            header = record
            continue
        if kind != "checkpoint":
            continue
        seq = record.get("seq")
        try:
            claims = verify_checkpoint_token(record.get("token", ""), keys)
        except ValueError as exc:
            raise _Fault(seq if isinstance(seq, int) else None, "bad_checkpoint_signature",
                         f"checkpoint on line {number}: {exc}") from exc
        if (claims.get("tenant") != header.get("tenant") or not isinstance(claims.get("seq"), int)
                or any(record.get(k) != claims.get(k) for k in ("tenant", "seq", "hash"))):
            raise _Fault(seq if isinstance(seq, int) else None, "bad_checkpoint_signature",
                         f"checkpoint on line {number}: signed claims do not match the line "
                         "or the export's tenant")
        signed[claims["seq"]] = str(claims["hash"])
    if header is None:
        raise _Fault(None, "malformed", "empty export")
    return header, signed


# --- the chain ------------------------------------------------------------------------------


def _classify_gap(expected: int, rest: Iterator[tuple[int, dict[str, Any], bool]]) -> str:
    for _, record, _ in islice(rest, LOOKAHEAD):
        if record.get("kind") == "event" and _event_seq(record) == expected:
            return "reordered"
    return "deleted"


def _next_event_seq(rest: Iterator[tuple[int, dict[str, Any], bool]]) -> int | None:
    for _, record, _ in islice(rest, LOOKAHEAD):
        if record.get("kind") == "event":
            return _event_seq(record)
    return None


def _check_chain(lines: Iterable[str], header: dict[str, Any], signed: dict[int, str]
                 ) -> tuple[int, int | None, int | None]:
    anchor = header.get("anchor") or {}
    anchor_seq, prev = anchor.get("seq"), anchor.get("hash")
    if not isinstance(anchor_seq, int) or not isinstance(prev, str):
        raise _Fault(None, "malformed", "header has no anchor")
    if not ((anchor_seq == 0 and prev == GENESIS) or signed.get(anchor_seq) == prev):
        raise _Fault(anchor_seq + 1, "bad_anchor",
                     f"anchor seq {anchor_seq} is not the genesis nor a signed checkpoint")
    expected, count, first, last = anchor_seq + 1, 0, None, None
    records = _records(lines)
    for number, record, hashed in records:
        if record.get("kind") != "event":
            continue
        body, digest, seq = record.get("body"), record.get("hash"), _event_seq(record)
        if not isinstance(body, dict) or not isinstance(digest, str) or seq is None:
            raise _Fault(expected, "malformed", f"line {number} is not an event record")
        if seq > expected:
            kind = _classify_gap(expected, records)
            raise _Fault(expected, kind, f"expected seq {expected}, found {seq} "
                         f"(line {number})")
        if seq < expected:
            raise _Fault(seq, "inserted", f"seq {seq} appears again on line {number}")
        problem = None
        if not hashed and hash_bytes(canonicalize(body)) != digest:
            problem = _Fault(seq, "edited", f"event {seq}'s content does not match its hash")
        elif body.get("prev_hash") != prev:
            problem = _Fault(seq - 1 if seq - 1 > anchor_seq else seq, "edited",
                             f"event {seq} does not link to the event before it")
        elif seq in signed and signed[seq] != digest:
            problem = _Fault(seq, "edited", f"event {seq} differs from its signed checkpoint")
        if problem is not None:
            if _next_event_seq(records) == seq:  # the real event follows a forged one
                raise _Fault(seq, "inserted", f"a second event claims seq {seq}")
            raise problem
        if body.get("tenant") != header.get("tenant"):
            raise _Fault(seq, "inserted", f"event {seq} belongs to another tenant")
        prev, expected, count, last = digest, expected + 1, count + 1, seq
        first = seq if first is None else first
    end = anchor_seq if last is None else last
    beyond = [s for s in signed if s > end]
    claimed = header.get("last_seq")
    if beyond or (isinstance(claimed, int) and claimed > end):
        raise _Fault(end + 1, "truncated",
                     f"events after seq {end} are missing (checkpoint or header names seq "
                     f"{max(beyond + [claimed if isinstance(claimed, int) else end])})")
    return count, first, last


def verify_export(open_lines: Callable[[], Iterable[str]], jwks: dict[str, Any]) -> Report:
    """Verify an export; ``open_lines()`` must return the lines anew on each call (two passes).

    Returns a :class:`Report`; ``ok`` is False with ``fault`` and ``bad_seq`` on the first fault.
    """
    keys = ed25519_keys(jwks)
    signed: dict[int, str] = {}
    try:
        header, signed = _read_checkpoints(open_lines(), keys)
        count, first, last = _check_chain(open_lines(), header, signed)
    except _Fault as fault:
        return Report(False, 0, len(signed), bad_seq=fault.seq, fault=fault.fault,
                      detail=fault.detail)
    bad = check_signed_reviews(open_lines())
    if bad is not None:
        return Report(False, count, len(signed), first, last, bad_seq=bad.seq,
                      fault=bad.fault, detail=bad.detail)
    return Report(True, count, len(signed), first, last)
