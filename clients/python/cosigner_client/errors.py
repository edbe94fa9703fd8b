"""The client's errors: data with stable codes, mirroring the server's problem codes.

Tree::

    GateError                      code, detail, status (HTTP status or None), extra
    ├── InvalidArguments           raised before any network call:
    │                              invalid_json, duplicate_key, non_finite_number,
    │                              unsafe_integer, invalid_tool_call
    ├── ServerRefused              a 4xx problem from the server, with its own code
    │                              (validation_failed, invalid_args, idempotency_conflict,
    │                              args_mismatch, already_redeemed, expired, forbidden, ...)
    ├── GateUnavailable            unavailable (connect error, 5xx), timeout, breaker_open
    └── CallRefused                raised by ``CallResult.unwrap()`` and ``@guard`` when the
                                   tool body did not run (code = the refusal's code)

Only :class:`InvalidArguments` (the caller's programming error) and :class:`CallRefused`
(asked for by ``unwrap``/``guard``) are raised; every other failure is returned as data:
a ``deny`` decision, a refused redemption, an unreported outcome, each carrying its error.
"""

from __future__ import annotations

from typing import Any

#: Codes the client adds to the server's problem codes.
UNAVAILABLE = "unavailable"
TIMEOUT = "timeout"
BREAKER_OPEN = "breaker_open"


class GateError(Exception):
    """Base of client errors. ``code`` is stable and machine-readable."""

    code: str = "gate_error"

    def __init__(self, detail: str = "", *, code: str | None = None, status: int | None = None,
                 **extra: Any) -> None:
        super().__init__(detail or (code or self.code))
        if code is not None:
            self.code = code
        self.detail = detail or self.code
        self.status = status
        self.extra = extra

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, detail={self.detail!r})"

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "detail": self.detail, "status": self.status}


class InvalidArguments(GateError):
    code = "invalid_json"


class ServerRefused(GateError):
    code = "refused"


class GateUnavailable(GateError):
    """The server could not be asked (or did not answer): treat as deny."""

    code = UNAVAILABLE


class CallRefused(GateError):
    """The guarded tool body did not run."""

    code = "refused"
