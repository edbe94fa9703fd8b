"""The gates' logic, written once without I/O (sans-IO) for ``Gate`` and ``AsyncGate``.

Each operation is a generator that yields *steps* (:class:`Http`, :class:`Sleep`,
:class:`Execute`) and receives their results; the sync and async gates only drive the
generators with their own HTTP client, sleep and call. So retries, the circuit breaker,
the redeem recovery and the fail direction behave identically in both.

Failure behaviour (all bounded by the gate's ``timeout`` per operation, default 2 s):

* decide is retried with backoff and jitter under the same ``request_id`` (the server
  answers a retried request with the first decision); when no answer comes the decision is
  ``deny`` — or, only for tools named in ``proceed_on_timeout``, a client-made ``allow``
  marked ``fail_open`` and reported as ``proceeded_on_timeout``;
* redeem is retried only when the request provably never left (connect error). After a
  timeout or a lost response it asks ``GET /v1/permits/{jti}`` first: ``issued`` → redeem
  again; ``redeemed`` by this caller → the lost redeem was ours, proceed once; anything
  else, or no answer → do not execute;
* outcome reports are retried like decide (an identical report is idempotent);
* every attempt is counted by the circuit breaker (a 429 proves the server up);
* a 429 or 503 with ``Retry-After`` is retried after that many seconds, only while it fits
  in the operation's timeout; otherwise the failure is returned at once;
* an ``abort`` event set by the caller ends the operation with ``aborted`` (never retried,
  never counted by the breaker, never a fail-open);
* a failure where the server could not decide (``FAIL_OPEN_KINDS``) follows the tool's
  fail direction: ``deny`` (default), or by name ``proceed`` / ``ask`` (a person, through
  ``ask_human``); the decision and the call result record the direction taken.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Collection, Generator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from cosigner_client._breaker import Breaker
from cosigner_client.canonical import args_hash, check_hashable
from cosigner_client.errors import (
    ABORTED,
    BREAKER_OPEN,
    FAIL_OPEN_KINDS,
    MALFORMED,
    TIMEOUT,
    UNAVAILABLE,
    GateError,
    GateUnavailable,
    InvalidArguments,
    ServerRefused,
    kind_of_status,
)
from cosigner_client.models import (
    Approval,
    CallResult,
    CallStatus,
    Catalogue,
    Decision,
    Outcome,
    OutcomeReport,
    Permit,
    Reason,
    Redemption,
    Run,
    SideEffect,
)

T = TypeVar("T")
Direction = Literal["deny", "ask", "proceed"]
DIRECTIONS = frozenset({"deny", "ask", "proceed"})
#: ``ask_human(tool, args, error) -> bool``: may the call run without a server decision?
AskHuman = Callable[[str, dict[str, Any], GateError], bool]
SIDE_EFFECTS = frozenset({"none", "committed", "not_executed", "unknown"})
_NO_SIDE_EFFECT_CLASSES = frozenset({"none", "read"})
#: Longest single long-poll asked of the server (it allows up to 60 s).
MAX_POLL_S = 25.0


# ----------------------------------------------------------------------------- steps


@dataclass(frozen=True, slots=True)
class Http:
    method: str
    path: str
    body: Any = None
    params: Mapping[str, Any] | None = None
    timeout: float = 2.0


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    data: Any
    #: ``Retry-After`` in seconds (RFC 9110 §10.2.3 delay-seconds), when sent.
    retry_after: float | None = None
    #: The body was not JSON.
    malformed: bool = False


@dataclass(frozen=True, slots=True)
class Failure:
    """No HTTP answer. ``connect``: the request never left; others: it may have."""

    kind: Literal["connect", "timeout", "transport", "breaker_open", "aborted"]
    detail: str


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Execute:
    fn: Callable[..., Any]
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Ran:
    value: Any


@dataclass(frozen=True, slots=True)
class Raised:
    exc: BaseException


Steps = Generator[Http | Sleep | Execute, Any, T]


# ----------------------------------------------------------------------------- helpers


def party(value: str | Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    """A principal/initiator object from ``"id"`` or ``{"id", "type"}``."""
    if value is None:
        raise InvalidArguments(f"{what} is required (pass it to the gate or the call)",
                               code="invalid_request")
    return {"id": value} if isinstance(value, str) else dict(value)


def run_ref(value: str | Mapping[str, Any] | None) -> dict[str, Any]:
    if value is None:
        raise InvalidArguments("no run: pass run= or call start_run() first",
                               code="invalid_request")
    return {"id": value} if isinstance(value, str) else dict(value)


def error_of(result: Reply | Failure) -> GateError:
    """The client error for a failed exchange (stable codes, see ``errors``)."""
    if isinstance(result, Failure):
        code = {"timeout": TIMEOUT, "breaker_open": BREAKER_OPEN,
                "aborted": ABORTED}.get(result.kind, UNAVAILABLE)
        return GateUnavailable(result.detail, code=code)
    data = result.data if isinstance(result.data, dict) else {}
    detail = str(data.get("detail") or f"HTTP {result.status}")
    server_code = str(data.get("code") or f"http_{result.status}")
    kind = kind_of_status(result.status, server_code)
    if result.status >= 500:
        return GateUnavailable(detail, code=kind, status=result.status,
                               retry_after=result.retry_after, server_code=server_code)
    return ServerRefused(detail, code=server_code, status=result.status, kind=kind,
                         retry_after=result.retry_after)


def malformed(what: str) -> GateUnavailable:
    """The error for an answer that is not the documented shape (``malformed``)."""
    return GateUnavailable(f"the server's answer to {what} is not the documented shape",
                           code=MALFORMED)


def _parsed(parse: Callable[[Any], T], reply: Reply, what: str) -> T | GateUnavailable:
    """``parse(reply.data)``, or :func:`malformed` when the body is no JSON object or
    lacks what the parser needs."""
    if reply.malformed or not isinstance(reply.data, dict):
        return malformed(what)
    try:
        return parse(reply.data)
    except (KeyError, TypeError, ValueError, AttributeError):
        return malformed(what)


def _iso(moment: datetime | str | None) -> str | None:
    if moment is None or isinstance(moment, str):
        return moment
    if moment.tzinfo is None:
        raise InvalidArguments("deadline must be timezone-aware", code="invalid_request")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Config:
    """Gate settings. Times in seconds."""

    timeout: float = 2.0
    retries: int = 2
    backoff_base: float = 0.05
    backoff_max: float = 0.5
    breaker_threshold: int = 5
    breaker_cooldown: float = 10.0
    approval_timeout: float = 60.0
    proceed_on_timeout: frozenset[str] = frozenset()
    #: Per tool: what a failure in ``FAIL_OPEN_KINDS`` does (default ``deny``).
    fail_directions: Mapping[str, Direction] = field(default_factory=dict)
    ask_human: AskHuman | None = None

    def direction(self, tool: str) -> Direction:
        """The fail direction declared for ``tool`` (``deny`` unless opted in by name)."""
        if tool in self.fail_directions:
            return self.fail_directions[tool]
        return "proceed" if tool in self.proceed_on_timeout else "deny"

    @property
    def attempt_timeout(self) -> float:
        """One attempt's share of ``timeout``: half when retries are allowed, so a
        retry after a timed-out attempt still fits in the operation's deadline."""
        return self.timeout / 2 if self.retries else self.timeout


class Protocol:
    """State and generator-based operations shared by ``Gate`` and ``AsyncGate``."""

    def __init__(self, *, config: Config, run: str | Mapping[str, Any] | None,
                 principal: str | Mapping[str, Any] | None,
                 initiator: str | Mapping[str, Any] | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.breaker = Breaker(threshold=config.breaker_threshold,
                               cooldown=config.breaker_cooldown, clock=clock)
        self.run = dict(run_ref(run)) if run is not None else None
        self.principal = principal
        self.initiator = initiator
        self._clock = clock

    # ------------------------------------------------------------------ exchange

    def _backoff(self, attempt: int) -> float:
        cap = min(self.config.backoff_max, self.config.backoff_base * 2.0**attempt)
        return cap / 2 + random.uniform(0, cap / 2)  # noqa: S311 - jitter, not crypto

    def exchange(self, method: str, path: str, *, body: Any = None,
                 params: Mapping[str, Any] | None = None, deadline: float, retries: int = 0,
                 unsent_only: bool = False, extra_timeout: float = 0.0
                 ) -> Steps[Reply | Failure]:
        """One request with retries (5xx / no answer) until ``deadline`` (monotonic s).

        ``unsent_only``: retry only failures where the request never left (connect).
        """
        attempt = 0
        while True:
            if not self.breaker.allow():
                return Failure("breaker_open", "circuit breaker is open; not asking the server")
            remaining = deadline - self._clock()
            if remaining <= 0:
                return Failure("timeout", "the gate's timeout passed")
            attempt_s = min(remaining, self.config.attempt_timeout) + extra_timeout
            result: Reply | Failure = yield Http(method, path, body, params, timeout=attempt_s)
            if isinstance(result, Failure) and result.kind == "aborted":
                return result  # the caller's choice says nothing about the server
            failed = isinstance(result, Failure) or result.status >= 500
            self.breaker.record(ok=not failed)
            limited = isinstance(result, Reply) and result.status == 429
            if not failed and not limited:
                return result
            # A 429 was refused before any work, so even a redeem may ask again.
            retryable = limited or not unsent_only or (isinstance(result, Failure)
                                                       and result.kind == "connect")
            delay = self._backoff(attempt)
            if isinstance(result, Reply) and result.retry_after is not None:
                delay = max(delay, result.retry_after)  # the server said when; not sooner
            if attempt >= retries or not retryable or self._clock() + delay >= deadline:
                return result
            yield Sleep(delay)
            attempt += 1

    # ------------------------------------------------------------------ decide

    def decide(self, tool: str, args: dict[str, Any], *,
               run: str | Mapping[str, Any] | None = None,
               principal: str | Mapping[str, Any] | None = None,
               initiator: str | Mapping[str, Any] | None = None,
               context: Mapping[str, Any] | None = None, request_id: str | None = None,
               side_effect: str | None = None, tool_version: str | None = None,
               mode: str | None = None,
               ) -> Steps[Decision]:
        if type(args) is not dict:
            raise InvalidArguments("args must be a JSON object (dict)", code="invalid_args")
        a_hash = args_hash(args)  # raises before any network call
        tool_ref: dict[str, Any] = {"name": tool}
        if side_effect is not None:
            tool_ref["side_effect"] = side_effect
        if tool_version is not None:
            tool_ref["version"] = tool_version
        body: dict[str, Any] = {
            "request_id": request_id or f"req-{uuid.uuid4().hex}",
            "run": run_ref(run if run is not None else self.run),
            "principal": party(principal if principal is not None else self.principal,
                               "principal"),
            "initiator": party(initiator if initiator is not None else self.initiator,
                               "initiator"),
            "tool": tool_ref,
            "args": args,
            "context": dict(context or {}),
        }
        if mode == "shadow":  # recorded as such; the server mints no permit for it
            body["mode"] = "shadow"
        check_hashable(body)  # context, run and parties obey the same strict rules
        result = yield from self.exchange("POST", "/v1/decisions", body=body,
                                          deadline=self._clock() + self.config.timeout,
                                          retries=self.config.retries)
        parsed = (_parsed(Decision.parse, result, "decide")
                  if isinstance(result, Reply) and result.status == 200 else None)
        if isinstance(parsed, Decision):
            decision = parsed
            if decision.args_hash != a_hash:  # the server hashed something else: fail closed
                error = GateError("server args_hash differs from the client's",
                                  code="args_hash_mismatch")
                return Decision(effect="deny", reasons=(Reason(error.code, error.detail),),
                                args_hash=a_hash, request_id=body["request_id"],
                                decision_id=decision.decision_id, error=error)
            return decision
        error = parsed if parsed is not None else error_of(result)
        direction = self.config.direction(tool) if error.kind in FAIL_OPEN_KINDS else "deny"
        if direction == "proceed":
            return Decision(effect="allow", fail_open=True, error=error,
                            fail_direction="proceed",
                            reasons=(Reason("proceeded_on_timeout",
                                            f"server {error.code}; {tool} opted in by name"),),
                            args_hash=a_hash, request_id=body["request_id"])
        if direction == "ask":
            return Decision(effect="require_approval", error=error, fail_direction="ask",
                            reasons=(Reason("ask_human_on_failure",
                                            f"server {error.code}; {tool} asks a person"),),
                            args_hash=a_hash, request_id=body["request_id"])
        return Decision(effect="deny", reasons=(Reason(error.code, error.detail),),
                        args_hash=a_hash, request_id=body["request_id"], error=error,
                        fail_direction="deny")

    # ------------------------------------------------------------------ approvals

    def wait_for_approval(self, approval: Decision | Approval | str, *,
                          timeout: float | None = None) -> Steps[Approval]:
        """Long-poll the approval until it leaves ``pending`` or ``timeout`` s pass."""
        if isinstance(approval, Decision):
            if approval.approval is None:
                raise InvalidArguments("decision has no approval request",
                                       code="invalid_request")
            approval = approval.approval
        last = approval if isinstance(approval, Approval) else Approval(id=approval,
                                                                        status="pending")
        deadline = self._clock() + (self.config.approval_timeout if timeout is None
                                    else timeout)
        attempt = 0
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                return replace(last, error=GateUnavailable(
                    "stopped waiting for the approval", code=TIMEOUT))
            wait = round(min(remaining, MAX_POLL_S), 3)
            started = self._clock()
            result = yield from self.exchange(
                "GET", f"/v1/approvals/{last.id}", params={"wait": wait},
                deadline=self._clock() + min(remaining, self.config.timeout),
                extra_timeout=wait)
            parsed = (_parsed(Approval.parse, result, "an approval read")
                      if isinstance(result, Reply) and result.status == 200 else None)
            if isinstance(parsed, GateError):
                return replace(last, error=parsed)
            if parsed is not None:
                attempt = 0
                last = parsed
                if last.terminal:
                    return last
                if self._clock() - started < wait / 2:  # the server did not hold the poll
                    yield Sleep(min(float(last.retry_after or 1), max(remaining, 0)))
                continue
            error = error_of(result)
            if isinstance(error, ServerRefused) or error.code in (BREAKER_OPEN, ABORTED):
                return replace(last, error=error)
            # 5xx or no answer mid-poll: keep trying until the deadline, never proceed.
            yield Sleep(min(self._backoff(attempt), max(deadline - self._clock(), 0)))
            attempt += 1

    # ------------------------------------------------------------------ redeem

    def permit_state(self, jti: str) -> Steps[dict[str, Any] | GateError]:
        result = yield from self.exchange("GET", f"/v1/permits/{jti}",
                                          deadline=self._clock() + self.config.timeout,
                                          retries=self.config.retries)
        if isinstance(result, Reply) and result.status == 200:
            if result.malformed or not isinstance(result.data, dict):
                return malformed("a permit read")
            data: dict[str, Any] = result.data
            return data
        return error_of(result)

    def redeem(self, permit: Permit | str, tool: str, args: dict[str, Any]
               ) -> Steps[Redemption]:
        if type(args) is not dict:
            raise InvalidArguments("args must be a JSON object (dict)", code="invalid_args")
        check_hashable(args)
        permit = Permit.from_token(permit) if isinstance(permit, str) else permit
        body = {"permit": permit.token, "tool": tool, "args": args}
        error: GateError = GateUnavailable("redeem did not complete", code=UNAVAILABLE)
        for _attempt in range(2):
            result = yield from self.exchange(
                "POST", "/v1/permits/redeem", body=body, unsent_only=True,
                deadline=self._clock() + self.config.timeout, retries=self.config.retries)
            ok = isinstance(result, Reply) and 200 <= result.status < 300
            if ok and isinstance(result, Reply) and not result.malformed and isinstance(
                    result.data, dict) and result.data.get("status") == "redeemed":
                return Redemption(ok=True, jti=permit.jti,
                                  redeemed_at=result.data.get("redeemed_at"))
            # A garbled 2xx is a lost answer: the permit may be spent; ask before running.
            error = malformed("redeem") if ok else error_of(result)
            maybe_ours = ok or (isinstance(result, Failure)
                                and result.kind in ("timeout", "transport")) or (
                isinstance(result, Reply) and result.status >= 500) or (
                _attempt > 0 and error.code == "already_redeemed")
            if not maybe_ours:
                return Redemption(ok=False, jti=permit.jti, error=error)
            # The request may have been processed: ask before doing anything else.
            state = yield from self.permit_state(permit.jti)
            if isinstance(state, GateError):
                return Redemption(ok=False, jti=permit.jti, error=GateUnavailable(
                    f"redeem outcome unknown ({error.code}); not executing",
                    code=error.code if error.code in (MALFORMED, ABORTED) else
                    state.code if state.code in (TIMEOUT, BREAKER_OPEN, ABORTED) else
                    UNAVAILABLE))
            status = state.get("status")
            if status == "redeemed":
                if state.get("redeemed_by_you"):
                    return Redemption(ok=True, jti=permit.jti, recovered=True,
                                      redeemed_at=state.get("redeemed_at"))
                return Redemption(ok=False, jti=permit.jti, error=ServerRefused(
                    "permit was already redeemed", code="already_redeemed"))
            if status != "issued":
                return Redemption(ok=False, jti=permit.jti, error=ServerRefused(
                    f"permit is {status}", code=str(status)))
            # Still issued: the lost request did not redeem it; one more try.
        return Redemption(ok=False, jti=permit.jti, error=error)

    # ------------------------------------------------------------------ report

    def report_outcome(self, decision: Decision | str, outcome: Outcome,
                       side_effect: SideEffect, *, cost_minor: int | None = None
                       ) -> Steps[OutcomeReport]:
        decision_id = decision.decision_id if isinstance(decision, Decision) else decision
        if outcome not in ("ok", "error", "timeout") or side_effect not in SIDE_EFFECTS:
            raise InvalidArguments("outcome must be ok|error|timeout and side_effect "
                                   "none|committed|not_executed|unknown",
                                   code="invalid_request")
        if decision_id is None:
            return OutcomeReport(ok=False, decision_id=None, outcome=outcome,
                                 side_effect=side_effect, cost_minor=cost_minor,
                                 error=GateError("no server decision to report on",
                                                 code="no_decision"))
        body: dict[str, Any] = {"outcome": outcome, "side_effect": side_effect}
        if cost_minor is not None:
            body["cost_minor"] = cost_minor
        check_hashable(body)
        result = yield from self.exchange(
            "POST", f"/v1/decisions/{decision_id}/outcome", body=body,
            deadline=self._clock() + self.config.timeout, retries=self.config.retries)
        ok = isinstance(result, Reply) and result.status == 200
        return OutcomeReport(ok=ok, decision_id=decision_id, outcome=outcome,
                             side_effect=side_effect, cost_minor=cost_minor,
                             error=None if ok else error_of(result))

    # ------------------------------------------------------------------ catalogue

    def tools(self) -> Steps[Catalogue]:
        """The tenant's tool catalogue; raises :class:`GateError` when it cannot be read."""
        result = yield from self.exchange("GET", "/v1/tools",
                                          deadline=self._clock() + self.config.timeout,
                                          retries=self.config.retries)
        if isinstance(result, Reply) and result.status == 200:
            catalogue = _parsed(Catalogue.parse, result, "tools")
            if isinstance(catalogue, GateError):
                raise catalogue
            return catalogue
        raise error_of(result)

    # ------------------------------------------------------------------ run contract

    def start_run(self, run_id: str | None = None, *,
                  allowed_tools: Collection[str] | None = None,
                  tool_limits: Mapping[str, int] | None = None,
                  max_tool_calls: int | None = None, max_cost: int | None = None,
                  deadline: datetime | str | None = None) -> Steps[Run]:
        run_id = run_id or f"run-{uuid.uuid4().hex}"
        body: dict[str, Any] = {"run_id": run_id,
                                "allowed_tools": sorted(allowed_tools)
                                if allowed_tools is not None else None,
                                "tool_limits": dict(tool_limits or {}),
                                "budget": {"max_tool_calls": max_tool_calls,
                                           "max_cost": max_cost},
                                "deadline": _iso(deadline)}
        check_hashable(body)
        result = yield from self.exchange("POST", "/v1/runs", body=body,
                                          deadline=self._clock() + self.config.timeout,
                                          retries=self.config.retries)
        if isinstance(result, Reply) and result.status in (200, 201):
            run = _parsed(Run.parse, result, "start_run")
            if isinstance(run, GateError):
                raise run
            self.run = {"id": run_id}
            return run
        raise error_of(result)

    # ------------------------------------------------------------------ all gates

    def _ask(self, *, tool: str, args: dict[str, Any], error: GateError) -> Any:
        """The person's answer through ``ask_human`` (may be awaitable; only ``True`` lets
        the call run; no callback: no)."""
        ask = self.config.ask_human
        return False if ask is None else ask(tool, dict(args), error)

    def call(self, tool: str, args: dict[str, Any], fn: Callable[..., Any], *,
             side_effect: str | None = None, cost_minor: int | Callable[[Any], int | None]
             | None = None, approval_timeout: float | None = None,
             **decide_kwargs: Any) -> Steps[CallResult]:
        """decide → (wait for approval) → redeem → ``fn(**args)`` → report."""
        decision = yield from self.decide(tool, args, side_effect=side_effect, **decide_kwargs)
        if decision.fail_direction == "ask" and decision.error is not None:
            asked = yield Execute(self._ask, {"tool": tool, "args": args,
                                              "error": decision.error})
            if not (isinstance(asked, Ran) and asked.value is True):
                return CallResult("denied", decision, fail_direction="ask")
            ran = yield Execute(fn, args)
            if isinstance(ran, Raised):
                raise ran.exc
            return CallResult("approved_by_human_on_failure", decision, value=ran.value,
                              fail_direction="ask")
        if decision.fail_open:
            ran = yield Execute(fn, args)
            if isinstance(ran, Raised):
                raise ran.exc
            return CallResult("proceeded_on_timeout", decision, value=ran.value,
                              fail_direction="proceed")
        if decision.effect == "deny":
            return CallResult("denied", decision, fail_direction=decision.fail_direction)
        permit, approval = decision.permit, None
        if decision.effect == "require_approval":
            if decision.approval is None:
                return CallResult("denied", decision)
            approval = yield from self.wait_for_approval(decision, timeout=approval_timeout)
            if not approval.approved:
                status: CallStatus = (
                    "approval_timeout" if approval.status == "pending" else
                    "approval_rejected" if approval.status == "rejected" else
                    "approval_expired" if approval.status == "expired" else
                    "approval_cancelled")
                return CallResult(status, decision, approval=approval)
            permit = approval.permit
        if permit is None:  # an allow whose permit the server withheld (review asked)
            return CallResult("denied", decision, approval=approval)
        return (yield from self.run_permitted(decision, approval, permit, tool, args, fn,
                                              side_effect=side_effect,
                                              cost_minor=cost_minor))

    def run_permitted(self, decision: Decision, approval: Approval | None, permit: Permit,
                      tool: str, args: dict[str, Any], fn: Callable[..., Any], *,
                      side_effect: str | None, cost_minor: Any) -> Steps[CallResult]:
        """redeem → ``fn(**args)`` → report the outcome, for a permit at hand. A redeem
        refused ``already_redeemed`` reports nothing: its first redeemer reports its own."""
        redemption = yield from self.redeem(permit, tool, args)
        if not redemption.ok:
            report = None
            if redemption.code != "already_redeemed":
                report = yield from self.report_outcome(decision, "error", "not_executed")
            return CallResult("redeem_refused", decision, approval=approval,
                              redemption=redemption, outcome=report)
        ran = yield Execute(fn, args)
        if isinstance(ran, Raised):
            exc = ran.exc
            declared = getattr(exc, "side_effect", None)
            yield from self.report_outcome(
                decision, "timeout" if isinstance(exc, TimeoutError) else "error",
                declared if declared in SIDE_EFFECTS else "unknown")
            raise exc
        cost = cost_minor(ran.value) if callable(cost_minor) else cost_minor
        done: SideEffect = "none" if side_effect in _NO_SIDE_EFFECT_CLASSES else "committed"
        report = yield from self.report_outcome(decision, "ok", done, cost_minor=cost)
        return CallResult("executed", decision, value=ran.value, approval=approval,
                          redemption=redemption, outcome=report)
