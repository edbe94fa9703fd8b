"""Cosigner's domain error tree.

Every error a domain function raises is a :class:`CosignerError` with a stable
machine ``code``. HTTP status mapping lives in one place (``cosigner.http.problems``);
domain code never knows about HTTP. The wire shape is an RFC 9457 problem document.

Tree::

    CosignerError
    ├── InvalidRequest       invalid_request, invalid_subject, invalid_roles, ... (4xx)
    │   ├── InvalidJSON          invalid_json, duplicate_key, non_finite_number,
    │   │                        unsafe_integer
    │   ├── InvalidArgs          invalid_args         (tool catalogue JSON Schema)
    │   ├── ValidationFailed     validation_failed    (wire model rejected)
    │   └── PayloadTooLarge      payload_too_large
    ├── AuthError
    │   ├── Unauthenticated      unauthenticated
    │   │   └── SignInRefused    oidc_* (single sign-on refused: the web pages' own
    │   │                        codes, never a JSON API answer)
    │   └── Forbidden            forbidden, cross_origin (a /ui post from another origin)
    ├── NotFound                 not_found
    ├── Conflict                 (state conflicts, 409)
    │   ├── IdempotencyConflict  idempotency_conflict
    │   ├── ApprovalStateError   approval_expired, approval_not_pending, ...
    │   ├── ReviewRefused        self_approval, duplicate_review, not_eligible,
    │   │                        step_up_required (403: a stronger sign-in needed), ...
    │   ├── OutcomeConflict      outcome_conflict
    │   ├── ContractConflict     contract_conflict    (run contracts never widen)
    │   ├── RunStarted           run_started          (a contract comes before the first call)
    │   └── SubjectConflict      subject_conflict     (one person, one principal)
    ├── PermitRefused            bad_signature, expired, not_yet_valid, args_mismatch,
    │                            tool_mismatch, tenant_mismatch, already_redeemed,
    │                            revoked, policy_changed, malformed_permit
    ├── PolicyError              policy_error, policy_load_failed
    ├── RateLimited              rate_limited (429, ``retry_after`` s: a limit or quota of
    │                            the credential or tenant is used up)
    ├── IntegrityFault           audit_event_unreadable (500 with its code: a stored record
    │                            an answer depends on does not read back)
    └── Unavailable              storage_unavailable, engine_unavailable (503)
        └── Overloaded           overloaded (503, ``retry_after`` s: a bounded queue is
                                 full; shed at once, nothing queued, nothing decided)
"""

from __future__ import annotations

from typing import Any


class CosignerError(Exception):
    """Base of every domain error.

    Attributes:
        code: stable machine-readable code (``snake_case``), part of the wire contract.
        detail: human-readable text; never contains secrets or raw tool arguments.
        extra: additional JSON-serialisable members for the problem document.
    """

    code: str = "internal_error"
    title: str = "Internal error"

    def __init__(self, detail: str = "", *, code: str | None = None, **extra: Any) -> None:
        super().__init__(detail or self.title)
        if code is not None:
            self.code = code
        self.detail = detail or self.title
        self.extra = extra


class InvalidRequest(CosignerError):
    code = "invalid_request"
    title = "Invalid request"


class InvalidJSON(InvalidRequest):
    code = "invalid_json"
    title = "Request body is not acceptable JSON"


class InvalidArgs(InvalidRequest):
    code = "invalid_args"
    title = "Tool arguments do not match the tool's schema"


class ValidationFailed(InvalidRequest):
    code = "validation_failed"
    title = "Request does not match the schema"


class PayloadTooLarge(InvalidRequest):
    code = "payload_too_large"
    title = "Request body is too large"


class AuthError(CosignerError):
    code = "unauthenticated"
    title = "Authentication required"


class Unauthenticated(AuthError):
    code = "unauthenticated"
    title = "Authentication required"


class SignInRefused(Unauthenticated):
    code = "signin_refused"
    title = "Sign-in refused"


class Forbidden(AuthError):
    code = "forbidden"
    title = "Not allowed for this principal"


class NotFound(CosignerError):
    code = "not_found"
    title = "Not found"


class Conflict(CosignerError):
    code = "conflict"
    title = "Conflict with the current state"


class IdempotencyConflict(Conflict):
    code = "idempotency_conflict"
    title = "request_id was already used with different content"


class ApprovalStateError(Conflict):
    code = "approval_not_pending"
    title = "Approval request is not pending"


class ReviewRefused(Conflict):
    code = "review_refused"
    title = "Review refused"


class OutcomeConflict(Conflict):
    code = "outcome_conflict"
    title = "An outcome was already reported for this decision"


class ContractConflict(Conflict):
    code = "contract_conflict"
    title = "A different contract is already registered for this run"


class RunStarted(Conflict):
    code = "run_started"
    title = "The run already has decisions; a contract must be registered before its first call"


class SubjectConflict(Conflict):
    code = "subject_conflict"
    title = "Another principal already has this subject id in canonical form"


class PermitRefused(CosignerError):
    code = "permit_refused"
    title = "Permit refused"


class PolicyError(CosignerError):
    code = "policy_error"
    title = "Policy error"


class Unavailable(CosignerError):
    code = "storage_unavailable"
    title = "Service unavailable; treat as deny"


class RateLimited(CosignerError):
    """A rate limit or quota is used up; ``retry_after`` (s, an integer ≥ 1) says when the
    limit that refused has room again."""

    code = "rate_limited"
    title = "Rate limit exceeded"


class IntegrityFault(CosignerError):
    """A stored record an answer depends on does not read back (rows deleted or damaged
    outside Cosigner: by hand, a partial restore, disk corruption). A server-side fault,
    answered as a 500 whose ``code`` names it (unlike other 500s, which say only
    ``internal_error``); ``detail`` is a fixed text, never the stored bytes or the
    decoder's message, which go to the log as ``reason``. Retrying does not help; an
    operator locates the damage with ``cosigner audit verify`` on an export.

    Attributes:
        reason: what the decoder found (log only, never on the wire).
    """

    code = "audit_event_unreadable"
    title = "An audit event this answer depends on does not read"

    def __init__(self, detail: str = "", *, reason: str = "", **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.reason = reason or self.detail


class Overloaded(Unavailable):
    """A bounded queue (decision-log writer, refusal writer, long-polls, webhook backlog) is
    full: the request is refused at once, before anything is decided or queued."""

    code = "overloaded"
    title = "Server overloaded; retry later, treat as deny"
