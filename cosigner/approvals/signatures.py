"""Signed reviews: the approver's own passkey signs the exact call (WebAuthn assertions).

A requirement (or one of its groups) with ``signature: "webauthn"`` counts an approval only
when it carries an assertion over the review statement's digest
(:mod:`cosigner.core.review_statements`). :func:`begin` issues the challenge: it builds the
statement (tenant, approval id, tool, args hash, decision, policy id/version/revision,
reviewer subject, time now), stores it server-side as a single-use challenge of two minutes,
and returns the options for ``navigator.credentials.get()`` (the person's live credentials,
user verification required). :func:`verify` runs inside the review's transaction: it
recomputes the statement from the *request row* and the caller, so an assertion made for
another request, decision or person never matches, then checks the assertion (origin, RP
id, UV, signature, counter), uses the challenge up and advances the credential's counter
with conditional updates (a replay on another replica finds them already moved).

API keys and Slack clicks (``Caller.authn.method``) never satisfy a signature requirement.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.approvals.requests import load
from cosigner.core.clock import isoformat
from cosigner.core.errors import ApprovalStateError, InvalidRequest, NotFound, ReviewRefused
from cosigner.core.review_statements import (
    UNSIGNABLE_METHODS,
    Assertion,
    SignatureCheckError,
    b64url,
    check_assertion,
    from_b64url,
    review_statement,
    statement_digest,
)
from cosigner.db.tables_passkeys import webauthn_credentials
from cosigner.identity import passkey_challenges as challenges
from cosigner.identity import passkeys
from cosigner.identity.principals import Caller
from cosigner.policy import quorum
from cosigner.policy.result import ApprovalRequirement, parse_requirement

if TYPE_CHECKING:
    from cosigner.context import AppContext

#: Refusal codes of a signed review, with the sentence the pages show.
REFUSALS: dict[str, str] = {
    "signature_required": "This request must be approved with your own passkey "
                          "(API keys and Slack cannot sign).",
    "signature_invalid": "Your passkey's signature did not verify.",
    "signature_challenge_mismatch": "The signature is for another request or decision.",
    "signature_replayed": "This signature was already used.",
    "signature_expired": "The signing request expired; sign again.",
    "unknown_credential": "This passkey is not registered to you in this tenant.",
    "credential_removed": "This passkey was removed.",
    "passkey_missing": "Register a passkey first (Passkeys page).",
}


def _refuse(code: str, detail: str | None = None) -> ReviewRefused:
    return ReviewRefused(detail or REFUSALS[code], code=code)


async def begin(deps: AppContext, caller: Caller, approval_id: str, *,
                decision: str) -> dict[str, Any]:
    """Challenge options for signing ``decision`` on a pending request::

        {"statement": {...}, "publicKey": <PublicKeyCredentialRequestOptions JSON>}

    Raises:
        InvalidRequest: ``invalid_decision``. ReviewRefused: ``signature_required`` (an API
        key or Slack), ``passkey_missing`` (no live credential), ``not_eligible``.
        NotFound: no such request in the tenant. ApprovalStateError:
        ``approval_not_pending``.
    """
    from webauthn import generate_authentication_options, options_to_json
    from webauthn.helpers.structs import (
        PublicKeyCredentialDescriptor,
        UserVerificationRequirement,
    )

    if decision not in ("approved", "rejected"):
        raise InvalidRequest("decision must be approved or rejected", code="invalid_decision")
    if caller.authn.method in UNSIGNABLE_METHODS or caller.kind != "user":
        raise _refuse("signature_required")
    rp = passkeys.relying_party(deps.settings.public_url)
    now = deps.clock()
    async with deps.db.transaction() as conn:
        row = await load(conn, caller.tenant, approval_id, lock=False)
        if row is None:
            raise NotFound("no such approval request")
        if row.status != "pending":
            raise ApprovalStateError(f"the approval request is {row.status}",
                                     code="approval_not_pending")
        if not caller.roles & quorum.required_roles(parse_requirement(row.requirement)):
            raise ReviewRefused("you hold none of the roles this request needs",
                                code="not_eligible")
        mine = await passkeys.credentials_of(conn, caller.tenant, caller.subject)
        if not mine:
            raise _refuse("passkey_missing")
        statement = _statement(row, caller, decision, isoformat(now))
        digest = await challenges.issue(
            conn, caller, purpose="review", now=now, challenge=statement_digest(statement),
            approval_id=row.id, decision=decision, statement=statement)
    options = generate_authentication_options(
        rp_id=rp.id, challenge=digest, timeout=challenges.TTL_S * 1000,
        allow_credentials=[PublicKeyCredentialDescriptor(id=from_b64url(c.credential_id))
                           for c in mine],
        user_verification=UserVerificationRequirement.REQUIRED)
    return {"statement": statement, "publicKey": json.loads(options_to_json(options))}


def _statement(row: Any, caller: Caller, decision: str, time: str) -> dict[str, Any]:
    return review_statement(tenant=row.tenant, approval_id=row.id, tool=row.tool,
                            args_hash=row.args_hash, decision=decision, policy=row.policy,
                            reviewer=caller.subject, time=time)


async def verify(deps: AppContext, conn: AsyncConnection, caller: Caller, row: Any, *,
                 decision: str, assertion: Any, now: datetime) -> dict[str, Any]:
    """Check ``assertion`` as ``caller``'s signature of ``decision`` on ``row``; returns the
    record kept on the review, its event and the permit::

        {"statement": {...}, "statement_digest": b64url, "credential_id": b64url,
         "authenticator_data": b64url, "client_data_json": b64url, "signature": b64url}

    Raises:
        ReviewRefused: ``signature_required`` (no assertion, or an API key / Slack caller),
        ``signature_invalid``, ``signature_challenge_mismatch``, ``signature_replayed``,
        ``signature_expired``, ``unknown_credential``, ``credential_removed``.
    """
    if caller.authn.method in UNSIGNABLE_METHODS or caller.kind != "user":
        raise _refuse("signature_required")
    if assertion is None or assertion == "":
        raise _refuse("signature_required")
    try:
        signed = Assertion.parse(assertion)
    except SignatureCheckError as exc:
        raise _refuse(exc.code, exc.detail) from exc
    credential = await passkeys.find_any(conn, caller.tenant, signed.credential_id)
    if credential is None or credential.subject != caller.subject:
        raise _refuse("unknown_credential")
    if credential.removed_at is not None:
        raise _refuse("credential_removed")
    challenge = signed.client_challenge()
    issued = None if challenge is None else await challenges.find(
        conn, caller, purpose="review", challenge=challenge)
    if issued is None:
        raise _refuse("signature_challenge_mismatch")
    if issued.used_at is not None:
        raise _refuse("signature_replayed")
    if not challenges.is_open(issued, now):
        raise _refuse("signature_expired")
    time = (issued.statement or {}).get("time")
    statement = _statement(row, caller, decision, str(time))
    digest = statement_digest(statement)
    rp = passkeys.relying_party(deps.settings.public_url)
    try:
        counter = check_assertion(signed, public_key=from_b64url(credential.public_key),
                                  digest=digest, rp_id=rp.id, origin=rp.origin,
                                  sign_count=int(credential.sign_count))
    except SignatureCheckError as exc:
        raise _refuse(exc.code, f"{REFUSALS[exc.code]} ({exc.detail})"[:300]) from exc
    if await challenges.take(conn, caller, purpose="review", challenge=challenge,
                             now=now) is None:
        raise _refuse("signature_replayed")
    # Conditional on the counter *and* on the credential still being live: a removal that
    # committed since it was read above must not let this review count (the log would show
    # the review after the removal).
    moved = await conn.execute(webauthn_credentials.update().where(
        webauthn_credentials.c.id == credential.id,
        webauthn_credentials.c.sign_count == credential.sign_count,
        webauthn_credentials.c.removed_at.is_(None))
        .values(sign_count=counter, last_used_at=now))
    if moved.rowcount != 1:
        now_row = await passkeys.find_any(conn, caller.tenant, signed.credential_id)
        if now_row is None or now_row.removed_at is not None:
            raise _refuse("credential_removed")
        raise _refuse("signature_replayed")
    return {"statement": statement, "statement_digest": b64url(digest), **signed.record()}


async def judge(deps: AppContext, conn: AsyncConnection, caller: Caller, row: Any,
                requirement: ApprovalRequirement, held: frozenset[str], *, decision: str,
                assertion: Any, now: datetime
                ) -> tuple[frozenset[str], dict[str, Any] | None]:
    """``(roles the review may count for, its verified signature or None)``.

    A given assertion is always checked (:func:`verify`). Without one, an approval by a
    person holding roles of groups that do not ask for a signature counts only for those;
    one who could count only where a signature is asked is refused ``signature_required``.

    Raises:
        ReviewRefused: what :func:`verify` raises.
    """
    signed_roles = requirement.signed_roles()
    if not assertion and (decision != "approved" or not held & signed_roles):
        return held, None
    if not assertion and held - signed_roles:
        return held - signed_roles, None
    return held, await verify(deps, conn, caller, row, decision=decision,
                              assertion=assertion, now=now)


def approver_signature(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a permit's ``approvers`` entry carries of a signed review (everything an
    executor needs to check it offline against ``GET /v1/approvers/keys``)."""
    if not record:
        return None
    return {"credential_id": record["credential_id"],
            "statement_digest": record["statement_digest"],
            "time": record["statement"]["time"],
            "authenticator_data": record["authenticator_data"],
            "client_data_json": record["client_data_json"],
            "signature": record["signature"]}
