"""Domain errors → RFC 9457 problem documents: the one place statuses are decided.

Every response for an error is ``application/problem+json`` with ``type``, ``title``,
``status``, ``detail`` and a stable ``code``. A 500 never carries internals; the
traceback goes to the log only.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from cosigner.core import errors

log = logging.getLogger("cosigner.api")

PROBLEM_TYPE = "https://cosigner.dev/problems/"

#: Most specific class first.
STATUS_BY_ERROR: tuple[tuple[type[errors.CosignerError], int], ...] = (
    (errors.PayloadTooLarge, 413),
    (errors.InvalidRequest, 422),
    (errors.Unauthenticated, 401),
    (errors.Forbidden, 403),
    (errors.NotFound, 404),
    (errors.Conflict, 409),
    (errors.PermitRefused, 409),
    (errors.PolicyError, 422),
    (errors.RateLimited, 429),
    (errors.Unavailable, 503),
    (errors.CosignerError, 500),
)
_STATUS_BY_CODE = {"invalid_json": 400, "payload_too_large": 413}
#: Refusals that are about *who* asks or *what* is presented are 403; refusals about the
#: current state (already redeemed, revoked, expired, policy changed, terminal request,
#: duplicate review) stay 409 (the class default above).
_FORBIDDEN_CODES = {
    # permits: signature, token shape and binding faults
    "bad_signature", "malformed_permit", "unknown_kid", "wrong_token_type",
    "wrong_audience", "tenant_mismatch", "tool_mismatch", "args_mismatch", "unknown_permit",
    "invalid_args",
    # reviews: separation of duties
    "not_eligible", "self_approval", "previous_approver", "break_glass_forbidden",
    "step_up_required",
}


def status_for(exc: errors.CosignerError) -> int:
    """HTTP status of a domain error (codes may refine the class mapping)."""
    if exc.code in _STATUS_BY_CODE:
        return _STATUS_BY_CODE[exc.code]
    if exc.code in _FORBIDDEN_CODES and isinstance(exc, (errors.PermitRefused,
                                                         errors.ReviewRefused)):
        return 403
    for cls, status in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return status
    return 500


def problem(status: int, code: str, title: str, detail: str, **extra: Any) -> JSONResponse:
    """Build a problem+json response."""
    body = {"type": PROBLEM_TYPE + code, "title": title, "status": status, "detail": detail,
            "code": code, **extra}
    headers = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="cosigner"'
    if status in (429, 503):
        # RFC 9110 §10.2.3: delay-seconds; the domain error names it (``retry_after``).
        retry = extra.get("retry_after")
        headers["Retry-After"] = str(max(1, int(retry))) if isinstance(retry, int) else "1"
    return JSONResponse(body, status_code=status, headers=headers,
                        media_type="application/problem+json")


def to_response(exc: errors.CosignerError) -> JSONResponse:
    status = status_for(exc)
    if isinstance(exc, errors.IntegrityFault):
        # Damaged stored data: its stable code and fixed detail go out, the decoder's
        # reason (which may quote stored bytes) to the log only.
        log.error("integrity fault %s: %s", exc.code, exc.reason)
        return problem(500, exc.code, exc.title, exc.detail)
    if status >= 500 and not isinstance(exc, errors.Unavailable):
        log.error("unexpected domain error %s: %s", exc.code, exc.detail)
        return problem(500, "internal_error", "Internal error", "internal error; see server log")
    return problem(status, exc.code, exc.title, exc.detail, **exc.extra)


def install(app: FastAPI) -> None:
    """Register the exception handlers on ``app``."""

    async def on_domain(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, errors.CosignerError)
        return to_response(exc)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return problem(422, "validation_failed", "Request does not match the schema",
                       "request parameters are invalid", errors=_clean(exc.errors()))

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return problem(exc.status_code, code, str(exc.detail), str(exc.detail))

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return problem(500, "internal_error", "Internal error", "internal error; see server log")

    app.add_exception_handler(errors.CosignerError, on_domain)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)


def _clean(items: Any) -> list[dict[str, Any]]:
    """Validation errors without echoing input values (they may hold secrets)."""
    return [{"loc": [str(p) for p in item.get("loc", ())], "msg": item.get("msg", ""),
             "type": item.get("type", "")} for item in items]
