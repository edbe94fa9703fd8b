"""Offline check of signed reviews in an export (part of ``cosigner audit verify``).

Trusts nothing but the log itself: the public keys are those of ``passkey.registered``
events *earlier in the same log* (a ``passkey.removed`` event ends a key's use), so an
insider who rewrites a signed review, or removes the registration it relies on, is caught
even after recomputing every chain hash. For each ``approval.reviewed`` event:

* with a ``signature``: the credential must have been registered earlier to the same
  subject as the event's actor and not removed since (else ``unknown_credential``); the
  statement must name this event's tenant, approval, tool, args hash, policy, decision and
  reviewer; its digest must be the recorded one; and the WebAuthn assertion must verify
  over it with that key, the registration's RP id and origin, user verification set
  (:func:`cosigner.core.review_statements.check_assertion`), else
  ``bad_approver_signature``;
* without one, an approval counted for a group whose requirement (from the request's
  ``approval.requested`` event, followed through ``approval.escalated``) asks
  ``signature: "webauthn"`` is ``missing_approver_signature``.

For each ``approval.approved`` event, every approver it counts for a group asking a
signature must carry the signature of a signed approval *verified earlier in the log* by
that person for this request (else ``missing_approver_signature``: the signed reviews were
deleted, or the approver's signature dropped), and that signature's statement must describe
this event's tenant, approval, tool, args hash and policy (else ``bad_approver_signature``:
the approval, and the permit minted with it, were moved to other arguments).

Needs the registrations in the export: verify an export that starts at the genesis (or
at a checkpoint before the first registration) to check signed reviews.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cosigner.core.review_statements import (
    Assertion,
    SignatureCheckError,
    b64url,
    check_assertion,
    from_b64url,
    review_statement,
    statement_digest,
)


@dataclass(frozen=True, slots=True)
class SignatureFault:
    seq: int
    fault: str  # bad_approver_signature | unknown_credential | missing_approver_signature
    detail: str


@dataclass
class _Key:
    public_key: str
    subject: str
    rp_id: str
    origin: str
    removed_seq: int | None = None


def _bodies(lines: Iterable[str]) -> Iterable[dict[str, Any]]:
    for line in lines:
        if '"event"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or record.get("kind") != "event":
            continue
        body = record.get("body")
        if isinstance(body, dict) and isinstance(body.get("seq"), int):
            yield body


def _signed_roles_by_stage(requirement: Any) -> list[frozenset[str]]:
    stages: list[frozenset[str]] = []
    while isinstance(requirement, dict):
        stages.append(frozenset(str(g.get("role")) for g in requirement.get("require") or []
                                if isinstance(g, dict) and g.get("signature")))
        requirement = requirement.get("on_expired")
    return stages


def _roles_by_stage(requirement: Any) -> list[frozenset[str]]:
    stages: list[frozenset[str]] = []
    while isinstance(requirement, dict):
        stages.append(frozenset(str(g.get("role")) for g in requirement.get("require") or []
                                if isinstance(g, dict)))
        requirement = requirement.get("on_expired")
    return stages


def check_signed_reviews(lines: Iterable[str]) -> SignatureFault | None:
    """The first signed-review fault of an export's events (in ``seq`` order), or ``None``."""
    keys: dict[str, _Key] = {}
    stages: dict[str, list[frozenset[str]]] = {}
    at_stage: dict[str, int] = {}
    asked: dict[str, list[frozenset[str]]] = {}
    #: (approval id, reviewer) → the verified signature of their signed approval.
    verified: dict[tuple[str, str], dict[str, Any]] = {}
    for body in _bodies(lines):
        kind, seq = body.get("type"), body["seq"]
        raw_payload = body.get("payload")
        payload: dict[str, Any] = raw_payload if isinstance(raw_payload, dict) else {}
        subject = body.get("subject")
        approval_id = subject.get("approval_id") if isinstance(subject, dict) else None
        if kind == "passkey.registered":
            keys[str(payload.get("credential_id"))] = _Key(
                str(payload.get("public_key")), str(payload.get("subject")),
                str(payload.get("rp_id")), str(payload.get("origin")))
        elif kind == "passkey.removed":
            known = keys.get(str(payload.get("credential_id")))
            if known is not None and known.removed_seq is None:
                known.removed_seq = seq
        elif kind == "approval.requested" and approval_id:
            stages[approval_id] = _signed_roles_by_stage(payload.get("requirement"))
            asked[approval_id] = _roles_by_stage(payload.get("requirement"))
            at_stage[approval_id] = 0
        elif kind == "approval.escalated" and approval_id:
            at_stage[approval_id] = at_stage.get(approval_id, 0) + 1
        elif kind == "approval.reviewed":
            signature = payload.get("signature")
            if signature is not None:
                fault = _check(body, payload, signature, keys)
                if fault is not None:
                    return SignatureFault(seq, *fault)
                if payload.get("decision") == "approved" and approval_id:
                    reviewer = str((body.get("actor") or {}).get("subject"))
                    verified[(approval_id, reviewer)] = signature
            elif payload.get("decision") == "approved" and approval_id:
                chain = stages.get(approval_id) or []
                index = at_stage.get(approval_id, 0)
                if index < len(chain) and str(payload.get("role")) in chain[index]:
                    return SignatureFault(seq, "missing_approver_signature",
                                          f"event {seq}: an approval counted for "
                                          f"{payload.get('role')!r}, which asks for a "
                                          "signature, carries none")
        elif kind == "approval.approved" and approval_id and approval_id in stages:
            chain, index = stages[approval_id], at_stage.get(approval_id, 0)
            signed_roles = chain[index] if index < len(chain) else frozenset()
            roles = asked[approval_id][index] if index < len(chain) else frozenset()
            named = [str(e.get("id")) for e in payload.get("approvers") or []
                     if isinstance(e, dict)]
            if len(set(named)) != len(named):  # one person, one count
                return SignatureFault(seq, "bad_approver_signature",
                                      f"event {seq}: one approver is counted twice")
            for entry in payload.get("approvers") or []:
                # Unsigned only for a group of this stage that asks none (a role the stage
                # never asked is checked like a signed one: it cannot count unsigned).
                role = str(entry.get("role")) if isinstance(entry, dict) else None
                if role in roles and role not in signed_roles:
                    continue
                found = _check_approver(body, approval_id, entry, verified)
                if found is not None:
                    return SignatureFault(seq, *found)
    return None


_REF_MEMBERS = ("credential_id", "statement_digest", "authenticator_data",
                "client_data_json", "signature")


def _check_approver(body: dict[str, Any], approval_id: str, entry: Any,
                    verified: dict[tuple[str, str], dict[str, Any]]) -> tuple[str, str] | None:
    """An ``approval.approved`` approver counted for a signed group: its signature must be
    one verified earlier for this request and person, over this event's statement."""
    seq = body["seq"]
    if not isinstance(entry, dict) or not isinstance(entry.get("signature"), dict):
        return ("missing_approver_signature", f"event {seq}: an approver counted for a "
                "group that asks for a signature carries none")
    subject, ref = str(entry.get("id")), entry["signature"]
    review = verified.get((approval_id, subject))
    if review is None:
        return ("missing_approver_signature", f"event {seq}: no signed approval by "
                f"{subject!r} of this request is recorded before it")
    expected = review_statement(
        tenant=str(body.get("tenant")), approval_id=approval_id, tool=str(body.get("tool")),
        args_hash=str(body.get("args_hash")), decision="approved", policy=body.get("policy"),
        reviewer=subject, time=str(ref.get("time")))
    if (b64url(statement_digest(expected)) != ref.get("statement_digest")
            or any(ref.get(k) != review.get(k) for k in _REF_MEMBERS)):
        return ("bad_approver_signature", f"event {seq}: {subject!r}'s signature does not "
                "describe this approval")
    return None


def _check(body: dict[str, Any], payload: dict[str, Any], signature: Any,
           keys: dict[str, _Key]) -> tuple[str, str] | None:
    seq = body["seq"]
    if not isinstance(signature, dict) or not isinstance(signature.get("statement"), dict):
        return "bad_approver_signature", f"event {seq}: malformed signature"
    key = keys.get(str(signature.get("credential_id")))
    reviewer = (body.get("actor") or {}).get("subject")
    if key is None or key.removed_seq is not None:
        why = "never registered earlier in this log" if key is None else \
            f"removed at seq {key.removed_seq}"
        return "unknown_credential", f"event {seq}: credential {why}"
    if key.subject != reviewer:
        return "unknown_credential", f"event {seq}: the credential is another person's"
    statement = signature["statement"]
    subject = body.get("subject") or {}
    expected = review_statement(
        tenant=str(body.get("tenant")), approval_id=str(subject.get("approval_id")),
        tool=str(body.get("tool")), args_hash=str(body.get("args_hash")),
        decision=str(payload.get("decision")), policy=body.get("policy"),
        reviewer=str(reviewer), time=str(statement.get("time")))
    if statement != expected:
        return ("bad_approver_signature", f"event {seq}: the signed statement does not "
                "describe this review")
    digest = statement_digest(statement)
    if signature.get("statement_digest") != b64url(digest):
        return "bad_approver_signature", f"event {seq}: statement digest does not match"
    try:
        check_assertion(Assertion.parse(signature), public_key=from_b64url(key.public_key),
                        digest=digest, rp_id=key.rp_id, origin=key.origin)
    except (SignatureCheckError, ValueError) as exc:
        return "bad_approver_signature", f"event {seq}: the assertion does not verify ({exc})"
    return None
