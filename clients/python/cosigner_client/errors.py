"""The client's errors: data with stable codes, mirroring the server's problem codes.

Tree::

    GateError                      code, kind, detail, status (HTTP status or None),
    │                              retry_after (s or None), extra
    ├── InvalidArguments           raised before any network call:
    │                              invalid_json, duplicate_key, non_finite_number,
    │                              unsafe_integer, invalid_tool_call
    ├── ServerRefused              a 4xx problem from the server, with its own code
    │                              (validation_failed, invalid_args, idempotency_conflict,
    │                              args_mismatch, already_redeemed, rate_limited, ...)
    ├── GateUnavailable            no usable answer: unavailable, timeout, breaker_open,
    │                              overloaded, malformed, aborted (code = kind)
    └── CallRefused                raised by ``CallResult.unwrap()`` and ``@guard`` when the
                                   tool body did not run (code = the refusal's code)

Every failure also has a ``kind``, one of :data:`FAILURE_KINDS`, to branch on (the
decision-provider contract's failure names); ``refused`` is a server's answer about this
call (404, 409: ``already_redeemed``, ``idempotency_conflict``, ...), not a failure:

==============  =====================================================================
kind            cause
==============  =====================================================================
auth            401, 403 (bad or missing key, a role or binding the key lacks)
invalid         400, 422 (the request or its arguments are refused as invalid)
rate_limited    429 (``retry_after``: the server's ``Retry-After``, honoured by retries
                while it fits in the gate's timeout)
overloaded      503 ``overloaded`` (a server queue is full; ``retry_after`` likewise)
timeout         no answer within the gate's timeout
aborted         the caller aborted (``abort=`` event set)
malformed       an answer that is not JSON or not the documented shape
too_large       413 (the body exceeds the server's limit)
unavailable     no connection, a transport error, any other 5xx
breaker_open    the circuit breaker is open: the server was not asked
==============  =====================================================================

Fail direction: every gate denies on a failure. Per tool, ``fail_directions={"tool":
"proceed" | "ask"}`` opts in to running without a decision (``proceed``) or to asking a
person through ``ask_human`` (``ask``) — only for the kinds in :data:`FAIL_OPEN_KINDS`
(the server could not decide); ``auth``, ``invalid``, ``too_large``, ``aborted`` and
refusals always deny. The direction taken is recorded in the result.

Only :class:`InvalidArguments` (the caller's programming error) and :class:`CallRefused`
(asked for by ``unwrap``/``guard``) are raised; every other failure is returned as data:
a ``deny`` decision, a refused redemption, an unreported outcome, each carrying its error.
"""

from __future__ import annotations

from typing import Any

#: Codes the client adds to the server's problem codes (also failure kinds).
UNAVAILABLE = "unavailable"
TIMEOUT = "timeout"
BREAKER_OPEN = "breaker_open"
OVERLOADED = "overloaded"
MALFORMED = "malformed"
ABORTED = "aborted"
AUTH = "auth"
INVALID = "invalid"
RATE_LIMITED = "rate_limited"
TOO_LARGE = "too_large"
#: A server answer about this call (404/409), not a failure of asking.
REFUSED = "refused"

FAILURE_KINDS = frozenset({AUTH, INVALID, RATE_LIMITED, OVERLOADED, TIMEOUT, ABORTED,
                           MALFORMED, TOO_LARGE, UNAVAILABLE, BREAKER_OPEN})
#: Failures where the server could not decide: a tool may opt in to ``proceed``/``ask``.
FAIL_OPEN_KINDS = frozenset({RATE_LIMITED, OVERLOADED, TIMEOUT, MALFORMED, UNAVAILABLE,
                             BREAKER_OPEN})


def kind_of_status(status: int, server_code: str = "") -> str:
    """The failure kind of an HTTP error status (see the table above)."""
    if status in (401, 403):
        return AUTH
    if status in (400, 422):
        return INVALID
    if status == 413:
        return TOO_LARGE
    if status == 429:
        return RATE_LIMITED
    if status == 503 and server_code == OVERLOADED:
        return OVERLOADED
    if status >= 500:
        return UNAVAILABLE
    return REFUSED


class GateError(Exception):
    """Base of client errors. ``code`` is stable and machine-readable."""

    code: str = "gate_error"
    default_kind: str | None = None

    def __init__(self, detail: str = "", *, code: str | None = None, status: int | None = None,
                 kind: str | None = None, retry_after: float | None = None,
                 **extra: Any) -> None:
        super().__init__(detail or (code or self.code))
        if code is not None:
            self.code = code
        self.detail = detail or self.code
        self.status = status
        #: One of :data:`FAILURE_KINDS`, or ``refused``.
        self.kind = kind or self.default_kind or (self.code if self.code in FAILURE_KINDS else
                             kind_of_status(status, self.code) if status else REFUSED)
        self.retry_after = retry_after
        self.extra = extra

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(code={self.code!r}, kind={self.kind!r}, "
                f"detail={self.detail!r})")

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "kind": self.kind, "detail": self.detail,
                "status": self.status, "retry_after": self.retry_after}


class InvalidArguments(GateError):
    code = "invalid_json"
    default_kind = INVALID


class ServerRefused(GateError):
    code = "refused"


class GateUnavailable(GateError):
    """The server could not be asked (or did not answer): treat as deny."""

    code = UNAVAILABLE


class CallRefused(GateError):
    """The guarded tool body did not run."""

    code = "refused"
