"""The stable problem ``code``s of the API: one table, and which routes answer which.

:data:`CODES` names every code the JSON API answers with the error class it is raised as;
its HTTP status is not written here but computed by :func:`cosigner.http.problems.status_for`
(the one place statuses are decided). :func:`codes_for` gives a route's codes: the
shared ones follow from what the route does (authenticates, parses a body, has path or
query parameters), the route's own come from :data:`ROUTE_CODES`. The OpenAPI document
lists them per response status as ``x-codes`` (:mod:`cosigner.http.openapi`);
tests/http/test_openapi_clients.py holds the table to the source (every code listed is
raised somewhere, every code raised is listed).
"""

from __future__ import annotations

from cosigner.core import errors
from cosigner.http.problems import status_for

#: code → the domain error class it is raised as.
CODES: dict[str, type[errors.CosignerError]] = {
    # authentication and roles
    "unauthenticated": errors.Unauthenticated,
    "forbidden": errors.Forbidden,
    "not_policy_admin": errors.Forbidden,
    # body and parameters
    "invalid_json": errors.InvalidJSON,
    "duplicate_key": errors.InvalidJSON,
    "non_finite_number": errors.InvalidJSON,
    "unsafe_integer": errors.InvalidJSON,
    "payload_too_large": errors.PayloadTooLarge,
    "validation_failed": errors.ValidationFailed,
    "invalid_args": errors.InvalidArgs,
    "invalid_cursor": errors.InvalidRequest,
    "invalid_contract": errors.InvalidRequest,
    "not_found": errors.NotFound,
    # decisions, runs, outcomes
    "idempotency_conflict": errors.IdempotencyConflict,
    "contract_conflict": errors.ContractConflict,
    "outcome_conflict": errors.OutcomeConflict,
    # approvals and reviews
    "not_an_allow_decision": errors.InvalidRequest,
    "no_review_requirement": errors.PolicyError,
    "approval_race": errors.Conflict,
    "policy_error": errors.PolicyError,
    "approval_expired": errors.ApprovalStateError,
    "approval_not_pending": errors.ApprovalStateError,
    "not_eligible": errors.ReviewRefused,
    "self_approval": errors.ReviewRefused,
    "previous_approver": errors.ReviewRefused,
    "duplicate_review": errors.ReviewRefused,
    "role_already_met": errors.ReviewRefused,
    "step_up_required": errors.ReviewRefused,
    "comment_required": errors.InvalidRequest,
    "comment_too_long": errors.InvalidRequest,
    "invalid_decision": errors.InvalidRequest,
    "reason_required": errors.InvalidRequest,
    "shadow_decision": errors.InvalidRequest,
    "reserved_tool": errors.InvalidRequest,
    "barrier_denied": errors.Forbidden,
    "invalid_requirement": errors.InvalidRequest,
    "invalid_time": errors.InvalidRequest,
    "tenant_required": errors.InvalidRequest,
    "break_glass_forbidden": errors.ReviewRefused,
    "reason_too_short": errors.InvalidRequest,
    "reason_too_long": errors.InvalidRequest,
    "invalid_verdict": errors.InvalidRequest,
    "no_after_review": errors.ApprovalStateError,
    "invalid_standing": errors.InvalidRequest,
    "standing_not_allowed": errors.InvalidRequest,
    "standing_needs_one_approver": errors.InvalidRequest,
    "standing_masked_path": errors.InvalidRequest,
    "standing_mismatch": errors.InvalidRequest,
    "not_rejected": errors.ApprovalStateError,
    "rejection_withdrawn": errors.ApprovalStateError,
    # signed reviews (cosigner.approvals.signatures)
    "signature_required": errors.ReviewRefused,
    "signature_invalid": errors.ReviewRefused,
    "signature_challenge_mismatch": errors.ReviewRefused,
    "signature_replayed": errors.ReviewRefused,
    "signature_expired": errors.ReviewRefused,
    "unknown_credential": errors.ReviewRefused,
    "credential_removed": errors.ReviewRefused,
    # permits
    "bad_signature": errors.PermitRefused,
    "malformed_permit": errors.PermitRefused,
    "unknown_kid": errors.PermitRefused,
    "wrong_token_type": errors.PermitRefused,
    "wrong_audience": errors.PermitRefused,
    "tenant_mismatch": errors.PermitRefused,
    "tool_mismatch": errors.PermitRefused,
    "args_mismatch": errors.PermitRefused,
    "unknown_permit": errors.PermitRefused,
    "already_redeemed": errors.PermitRefused,
    "revoked": errors.PermitRefused,
    "expired": errors.PermitRefused,
    "not_yet_valid": errors.PermitRefused,
    "policy_changed": errors.PermitRefused,
    # policy administration
    "unknown_policy_version": errors.PolicyError,
    # storage
    "storage_unavailable": errors.Unavailable,
    "audit_event_unreadable": errors.IntegrityFault,
}

#: Every authenticated route: no or a bad key, a missing role, the key lookup failing.
AUTHENTICATED = ("unauthenticated", "forbidden", "storage_unavailable")
#: Every route that parses its JSON body itself (cosigner.http.body.strict_body).
BODY = ("invalid_json", "duplicate_key", "non_finite_number", "unsafe_integer",
        "payload_too_large", "validation_failed")
#: Every route with path or query parameters FastAPI validates.
PARAMETERS = ("validation_failed",)

_REVIEW_STATE = ("not_found", "approval_expired", "approval_not_pending")

#: A code a route raises as another class than :data:`CODES` says (so with another status).
Raised = tuple[str, type[errors.CosignerError]]

#: The codes particular to each route, by route function name (= operation id).
ROUTE_CODES: dict[str, tuple[str | Raised, ...]] = {
    "post_decision": ("idempotency_conflict", "invalid_args", "reserved_tool"),
    "post_approval": ("not_found", "already_redeemed", "not_an_allow_decision",
                      "no_review_requirement", "approval_race", "policy_error",
                      "shadow_decision", "barrier_denied", "invalid_requirement"),
    "list_approvals": (),
    "get_approval": ("not_found",),
    "post_review": (*_REVIEW_STATE, "not_eligible", "self_approval", "previous_approver",
                    "duplicate_review", "role_already_met", "step_up_required",
                    "comment_required",
                    "comment_too_long", "invalid_decision", "invalid_standing",
                    "standing_not_allowed", "standing_needs_one_approver",
                    "standing_masked_path", "standing_mismatch", "signature_required"),
    "post_cancel": _REVIEW_STATE,
    "post_withdraw_rejection": ("not_found", "not_eligible", "self_approval", "not_rejected",
                                "rejection_withdrawn", "reason_required"),
    "post_break_glass": (*_REVIEW_STATE, "forbidden", "self_approval",
                         "break_glass_forbidden", "reason_too_short", "reason_too_long"),
    "post_after_review": ("not_found", "not_eligible", "self_approval", "no_after_review",
                          "invalid_verdict", "comment_required"),
    "list_standing": (),
    "post_revoke_standing": ("not_found", "not_eligible"),
    "post_redeem": ("bad_signature", "malformed_permit", "unknown_kid", "wrong_token_type",
                    "wrong_audience", "tenant_mismatch", "tool_mismatch", "args_mismatch",
                    "unknown_permit", ("invalid_args", errors.PermitRefused),
                    "already_redeemed", "revoked",
                    "expired", "not_yet_valid", "policy_changed"),
    "post_revoke": ("not_found", "already_redeemed"),
    "get_approver_keys": (),
    "list_approver_credentials": (),
    "delete_approver_credential": ("not_found",),
    "list_policies": (),
    "reload_policies": ("not_policy_admin",),
    "activate_version": ("not_policy_admin", "not_found", "unknown_policy_version"),
    "set_shadow": ("not_policy_admin", "not_found", "unknown_policy_version"),
    "get_shadow_report": ("not_found",),
    "replay_candidate": ("not_policy_admin", "not_found", "unknown_policy_version",
                         "invalid_time", "tenant_required"),
    "post_run": ("contract_conflict", "invalid_contract"),
    "get_run": ("not_found",),
    "post_outcome": ("not_found", "outcome_conflict"),
    "get_permit": ("not_found", "audit_event_unreadable"),
    "get_tools": (),
    "list_events": ("invalid_cursor",),
    "list_checkpoints": ("invalid_cursor",),
    "create_checkpoint": (),
    "export_log": (),
}


def status_of(code: str, raised_as: type[errors.CosignerError] | None = None) -> int:
    """The HTTP status a problem with ``code`` is answered with."""
    return status_for((raised_as or CODES[code])(code=code))


def codes_for(name: str, *, authenticated: bool, body: bool, parameters: bool
              ) -> dict[int, list[str]]:
    """``{status: [code, ...]}`` a route answers, each list sorted.

    Raises:
        KeyError: a route missing from :data:`ROUTE_CODES` or a code missing from
        :data:`CODES` (the OpenAPI document is then not built: the table stays whole).
    """
    if name not in ROUTE_CODES:
        raise KeyError(f"route {name!r} is missing from cosigner.http.codes.ROUTE_CODES: "
                       "list the codes it answers there")
    shared = ((AUTHENTICATED, authenticated), (BODY, body), (PARAMETERS, parameters))
    entries = [*ROUTE_CODES[name], *(code for codes, on in shared if on for code in codes)]
    by_status: dict[int, set[str]] = {}
    for entry in entries:
        code, raised_as = entry if isinstance(entry, tuple) else (entry, None)
        by_status.setdefault(status_of(code, raised_as), set()).add(code)
    return {status: sorted(codes) for status, codes in sorted(by_status.items())}
