"""``Gate`` (sync) and ``AsyncGate``: the three gates of a tool call over HTTP.

Both drive the same sans-IO operations (``cosigner_client._core``); see that module for
retries, the circuit breaker, redeem recovery and the fail direction.

Site modes (``mode=`` per gate, ``modes={tool: mode}`` per tool, or ``mode=`` per call):
``on`` runs every gate; ``shadow`` asks Cosigner with the decision marked ``mode: shadow``
(recorded, never a permit), always runs the tool and returns what would have happened
(``CallResult.status == "shadow"``, ``.decision``); ``off`` runs the tool without asking
and records nothing (``status == "off"``).

The failure kinds are in ``cosigner_client.errors``.

Aborting: every gate method takes ``abort=`` (a ``threading.Event`` for :class:`Gate`, an
``asyncio.Event`` for :class:`AsyncGate`). Once set, the operation ends with ``aborted``:
the async gate drops the request in flight at once; the sync gate stops at the next step
(before a request or retry, or during a back-off), a request in flight ending within its
timeout. Cancelling an ``AsyncGate`` call's task still raises ``CancelledError`` as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import datetime
from typing import Any, Literal, ParamSpec, TypeVar, get_args

import httpx

from cosigner_client._breaker import Breaker
from cosigner_client._core import (
    DIRECTIONS,
    AskHuman,
    Config,
    Direction,
    Execute,
    Failure,
    Http,
    Protocol,
    Raised,
    Ran,
    Reply,
    Sleep,
    Steps,
)
from cosigner_client.errors import InvalidArguments
from cosigner_client.models import (
    Approval,
    CallResult,
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

__all__ = ["AsyncGate", "Gate", "Mode"]

log = logging.getLogger("cosigner_client")
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
Party = str | Mapping[str, Any] | None
Mode = Literal["off", "shadow", "on"]
MODES: frozenset[str] = frozenset(get_args(Mode))


def _checked_mode(mode: str) -> Mode:
    if mode not in MODES:
        raise ValueError(f"mode must be one of off, shadow, on (got {mode!r})")
    return mode  # type: ignore[return-value]


def _off(args: dict[str, Any], fn: Callable[..., Any]) -> Steps[CallResult]:
    """Mode ``off``: run the tool; Cosigner is not asked and nothing is recorded."""
    ran = yield Execute(fn, args)
    if isinstance(ran, Raised):
        raise ran.exc
    decision = Decision(effect="allow", reasons=(Reason("mode_off", "site mode off"),),
                        args_hash="", request_id="")
    return CallResult("off", decision, value=ran.value)


def _shadow(p: Protocol, tool: str, args: dict[str, Any], fn: Callable[..., Any],
            kwargs: dict[str, Any]) -> Steps[CallResult]:
    """Mode ``shadow``: ask (decision marked ``mode: shadow``), then run the tool whatever
    the answer; the result carries what would have happened."""
    for name in ("approval_timeout", "cost_minor"):
        kwargs.pop(name, None)
    try:
        decision = yield from p.decide(tool, args, mode="shadow", **kwargs)
    except InvalidArguments as exc:  # would have been refused (422): still run it
        decision = Decision(effect="deny", reasons=(Reason(exc.code, exc.detail),),
                            args_hash="", request_id="", error=exc)
    log.info("cosigner shadow: %s would have been %s (%s)", tool, decision.effect,
             decision.reason)
    ran = yield Execute(fn, args)
    if isinstance(ran, Raised):
        raise ran.exc
    return CallResult("shadow", decision, value=ran.value)


def _encode(body: Any) -> bytes:
    # json.dumps writes floats with repr (round-trips exactly); non-finite values and
    # unsafe ints were refused by canonical.check_hashable before we got here.
    return json.dumps(body, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode("utf-8")


def _trace_headers() -> dict[str, str]:
    """W3C ``traceparent`` (and ``tracestate``) of the caller's current OpenTelemetry span,
    so the server's spans join the agent step's trace; empty without opentelemetry-api or
    outside a span."""
    try:
        from opentelemetry.propagate import inject
    except ImportError:
        return {}
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier


def _request_kwargs(step: Http) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"timeout": httpx.Timeout(max(step.timeout, 0.001))}
    if step.params:
        kwargs["params"] = dict(step.params)
    headers = _trace_headers()
    if step.body is not None:
        kwargs["content"] = _encode(step.body)
        headers["Content-Type"] = "application/json"
    if headers:
        kwargs["headers"] = headers
    return kwargs


def _reply(resp: httpx.Response) -> Reply:
    garbled = False
    try:
        data = resp.json() if resp.content else None
    except ValueError:
        data, garbled = None, True
    return Reply(resp.status_code, data, retry_after=_retry_after(resp), malformed=garbled)


def _retry_after(resp: httpx.Response) -> float | None:
    """``Retry-After`` as delay-seconds (RFC 9110 §10.2.3); an HTTP-date or garbage is
    ignored (the back-off applies)."""
    value = resp.headers.get("retry-after", "").strip()
    if not value.isdigit():
        return None
    return float(min(int(value), 3600))


_ABORTED = Failure("aborted", "the caller aborted the call")


def _failure(exc: httpx.HTTPError) -> Failure:
    name = type(exc).__name__
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return Failure("connect", f"could not connect to the server ({name})")
    if isinstance(exc, httpx.TimeoutException):
        return Failure("timeout", f"the server did not answer in time ({name})")
    return Failure("transport", f"the connection failed ({name})")


def _bind(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
          ) -> dict[str, Any]:
    """Arguments by name, defaults applied: what is hashed is exactly what runs (K07)."""
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _config(timeout: float, retries: int, breaker_threshold: int, breaker_cooldown: float,
            approval_timeout: float, proceed_on_timeout: Collection[str],
            fail_directions: Mapping[str, Direction] | None = None,
            ask_human: AskHuman | None = None) -> Config:
    if isinstance(proceed_on_timeout, str):
        raise TypeError("proceed_on_timeout takes a collection of tool names")
    directions = dict(fail_directions or {})
    for tool, direction in directions.items():
        if direction not in DIRECTIONS:
            raise ValueError(f"fail direction of {tool!r} must be deny, ask or proceed")
    if "ask" in directions.values() and ask_human is None:
        raise TypeError("a tool whose fail direction is 'ask' needs ask_human=")
    return Config(timeout=timeout, retries=retries, breaker_threshold=breaker_threshold,
                  breaker_cooldown=breaker_cooldown, approval_timeout=approval_timeout,
                  proceed_on_timeout=frozenset(proceed_on_timeout),
                  fail_directions=directions, ask_human=ask_human)


class _Base:
    def __init__(self, *, timeout: float, retries: int, breaker_threshold: int,
                 breaker_cooldown: float, approval_timeout: float,
                 proceed_on_timeout: Collection[str], run: Party, principal: Party,
                 initiator: Party, mode: Mode = "on",
                 modes: Mapping[str, Mode] | None = None,
                 fail_directions: Mapping[str, Direction] | None = None,
                 ask_human: AskHuman | None = None) -> None:
        self.mode = _checked_mode(mode)
        self.modes = {tool: _checked_mode(m) for tool, m in (modes or {}).items()}
        self._p = Protocol(config=_config(timeout, retries, breaker_threshold,
                                          breaker_cooldown, approval_timeout,
                                          proceed_on_timeout, fail_directions, ask_human),
                           run=run, principal=principal, initiator=initiator)
        config = self._p.config
        opted = sorted({*config.proceed_on_timeout,
                        *(t for t, d in config.fail_directions.items() if d != "deny")})
        if opted:
            log.warning("cosigner gate does not deny when the server cannot decide for: %s",
                        ", ".join(f"{t} ({config.direction(t)})" for t in opted))

    @property
    def config(self) -> Config:
        return self._p.config

    def mode_of(self, tool: str) -> Mode:
        """The site mode of ``tool``: its entry in ``modes``, else the gate's ``mode``."""
        return self.modes.get(tool, self.mode)

    def _call_steps(self, tool: str, args: dict[str, Any], fn: Callable[..., Any],
                    kwargs: dict[str, Any]) -> Steps[CallResult]:
        mode = _checked_mode(kwargs.pop("mode", None) or self.mode_of(tool))
        if mode == "off":
            return _off(args, fn)
        if mode == "shadow":
            return _shadow(self._p, tool, args, fn, kwargs)
        return self._p.call(tool, args, fn, **kwargs)

    @property
    def breaker(self) -> Breaker:
        """The gate's circuit breaker (``breaker.state``: closed | open | half_open)."""
        return self._p.breaker

    @property
    def run(self) -> dict[str, Any] | None:
        """The default run of this gate's decisions (set by :meth:`start_run`)."""
        return self._p.run

    @staticmethod
    def _headers(api_key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}", "User-Agent": "cosigner-client/0.1"}

    @staticmethod
    def _note(result: CallResult) -> CallResult:
        if result.status in ("proceeded_on_timeout", "approved_by_human_on_failure"):
            log.warning("%s ran WITHOUT a server decision (%s; fail direction %s)",
                        result.decision.request_id, result.failure, result.fail_direction)
        return result


class Gate(_Base):
    """Synchronous gate. ``Gate(url, api_key, principal=..., initiator=...)``.

    Args:
        url: the Cosigner base URL. api_key: a ``runtime`` key (``csk_...``).
        timeout: seconds per gate operation, retries included (default 2).
        retries: extra attempts for decide and outcome reports (same request_id).
        breaker_threshold / breaker_cooldown: failed attempts that open the circuit
            breaker, and seconds before it lets one probe through.
        approval_timeout: default seconds ``call`` waits for a human approval.
        proceed_on_timeout: tool names that may run without a decision when the server
            cannot answer (opt-in by name; reported as ``proceeded_on_timeout``). Empty by
            default: every gate fails closed. Same as ``fail_directions={tool: "proceed"}``.
        fail_directions: per tool, ``"deny"`` (the default), ``"proceed"`` or ``"ask"``:
            what a failure where the server could not decide (``rate_limited``,
            ``overloaded``, ``timeout``, ``malformed``, ``unavailable``, ``breaker_open``)
            does; recorded as ``fail_direction`` in the decision and the call result.
        ask_human: ``ask_human(tool, args, error) -> bool`` (may be async for
            :class:`AsyncGate`), asked for ``"ask"`` tools; only ``True`` runs the call.
        run, principal, initiator: defaults for every decision (``"id"`` or a dict).
        mode / modes: the site mode of every tool / of named tools, ``off | shadow | on``
            (see the module docstring); ``call(..., mode=...)`` overrides both.
        transport: an ``httpx`` transport (tests).
    """

    def __init__(self, url: str, api_key: str, *, timeout: float = 2.0, retries: int = 2,
                 breaker_threshold: int = 5, breaker_cooldown: float = 10.0,
                 approval_timeout: float = 60.0, proceed_on_timeout: Collection[str] = (),
                 run: Party = None, principal: Party = None, initiator: Party = None,
                 mode: Mode = "on", modes: Mapping[str, Mode] | None = None,
                 fail_directions: Mapping[str, Direction] | None = None,
                 ask_human: AskHuman | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(timeout=timeout, retries=retries, breaker_threshold=breaker_threshold,
                         breaker_cooldown=breaker_cooldown, approval_timeout=approval_timeout,
                         proceed_on_timeout=proceed_on_timeout, run=run, principal=principal,
                         initiator=initiator, mode=mode, modes=modes,
                         fail_directions=fail_directions, ask_human=ask_human)
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=self._headers(api_key),
                                  transport=transport)

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _drive(self, steps: Steps[T], abort: threading.Event | None = None) -> T:
        sent: Any = None
        while True:
            try:
                step = steps.send(sent)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if isinstance(step, Http):
                if abort is not None and abort.is_set():
                    sent = _ABORTED
                    continue
                try:
                    sent = _reply(self._http.request(step.method, step.path,
                                                     **_request_kwargs(step)))
                except httpx.HTTPError as exc:
                    sent = _failure(exc)
            elif isinstance(step, Sleep):
                if abort is not None:
                    abort.wait(step.seconds)  # wakes at once when the caller aborts
                else:
                    time.sleep(step.seconds)
                sent = None
            else:
                sent = self._execute(step)

    @staticmethod
    def _execute(step: Execute) -> Ran | Raised:
        try:
            return Ran(step.fn(**step.args))
        except Exception as exc:  # noqa: BLE001 - reported, then re-raised by the protocol
            return Raised(exc)

    # -- the gates ------------------------------------------------------------------

    def decide(self, tool: str, args: dict[str, Any], **kwargs: Any) -> Decision:
        """Ask whether ``tool(args)`` may run. Keyword args: ``run, principal, initiator,
        context, request_id, side_effect, tool_version``. Never raises for server or
        network trouble (→ ``deny`` with ``error``); raises :class:`InvalidArguments`
        before any network call for arguments the server would refuse."""
        abort = kwargs.pop("abort", None)
        return self._drive(self._p.decide(tool, args, **kwargs), abort)

    def wait_for_approval(self, approval: Decision | Approval | str, *,
                          timeout: float | None = None,
                          abort: threading.Event | None = None) -> Approval:
        """Long-poll until approved / rejected / expired / cancelled, or ``timeout`` s."""
        return self._drive(self._p.wait_for_approval(approval, timeout=timeout), abort)

    def redeem(self, permit: Permit | str, tool: str, args: dict[str, Any], *,
               abort: threading.Event | None = None) -> Redemption:
        """Redeem a permit for exactly ``tool(args)`` right before running it."""
        return self._drive(self._p.redeem(permit, tool, args), abort)

    def report_outcome(self, decision: Decision | str, outcome: Outcome,
                       side_effect: SideEffect, *, cost_minor: int | None = None
                       ) -> OutcomeReport:
        """Report ``ok | error | timeout`` and ``none | committed | not_executed | unknown``."""
        return self._drive(self._p.report_outcome(decision, outcome, side_effect,
                                                  cost_minor=cost_minor))

    def tools(self) -> Catalogue:
        """The tenant's tool catalogue (``GET /v1/tools``): which tool names are denied
        outright. Raises :class:`GateError` when it cannot be read."""
        return self._drive(self._p.tools())

    def start_run(self, run_id: str | None = None, *,
                  allowed_tools: Collection[str] | None = None,
                  tool_limits: Mapping[str, int] | None = None,
                  max_tool_calls: int | None = None, max_cost: int | None = None,
                  deadline: datetime | str | None = None) -> Run:
        """Register the run contract and make ``run_id`` this gate's run. Raises
        :class:`GateError` when the contract cannot be registered."""
        return self._drive(self._p.start_run(
            run_id, allowed_tools=allowed_tools, tool_limits=tool_limits,
            max_tool_calls=max_tool_calls, max_cost=max_cost, deadline=deadline))

    def call(self, tool: str, args: dict[str, Any], fn: Callable[..., Any],
             **kwargs: Any) -> CallResult:
        """Run all gates around ``fn(**args)``: decide, wait for approval, redeem, run,
        report. ``fn`` runs only after a successful redeem. Keyword args: those of
        :meth:`decide` plus ``side_effect`` (the tool's class: ``none|read|write|financial|
        destructive``), ``cost_minor`` (int or ``f(result)``), ``approval_timeout``,
        ``mode`` (this call's site mode). An
        exception from ``fn`` is reported (``error``, side effect ``unknown`` unless the
        exception has a ``side_effect`` attribute) and re-raised."""
        abort = kwargs.pop("abort", None)
        return self._note(self._drive(self._call_steps(tool, args, fn, kwargs), abort))

    def guard(self, tool: str, **kwargs: Any) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Decorator: calls go through :meth:`call`; raises :class:`CallRefused` when the
        body did not run. Arguments are bound by name with defaults applied."""
        def decorate(fn: Callable[P, R]) -> Callable[P, R]:
            @functools.wraps(fn)
            def wrapper(*a: P.args, **kw: P.kwargs) -> R:
                args = _bind(fn, a, kw)
                return self.call(tool, args, fn, **kwargs).unwrap()  # type: ignore[no-any-return]
            return wrapper
        return decorate


async def _until_aborted(work: Awaitable[Any], abort: asyncio.Event | None,
                         aborted: Any) -> Any:
    """``await work``, unless ``abort`` is set first: then ``work`` is cancelled and
    ``aborted`` returned."""
    if abort is None:
        return await work
    if abort.is_set():
        if inspect.iscoroutine(work):
            work.close()
        return aborted
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(abort.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return aborted if not task.done() or task.cancelled() else task.result()


class AsyncGate(_Base):
    """Asynchronous gate; same arguments and methods as :class:`Gate`, awaited. ``fn``
    passed to ``call``/``guard`` may be sync or async."""

    def __init__(self, url: str, api_key: str, *, timeout: float = 2.0, retries: int = 2,
                 breaker_threshold: int = 5, breaker_cooldown: float = 10.0,
                 approval_timeout: float = 60.0, proceed_on_timeout: Collection[str] = (),
                 run: Party = None, principal: Party = None, initiator: Party = None,
                 mode: Mode = "on", modes: Mapping[str, Mode] | None = None,
                 fail_directions: Mapping[str, Direction] | None = None,
                 ask_human: AskHuman | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(timeout=timeout, retries=retries, breaker_threshold=breaker_threshold,
                         breaker_cooldown=breaker_cooldown, approval_timeout=approval_timeout,
                         proceed_on_timeout=proceed_on_timeout, run=run, principal=principal,
                         initiator=initiator, mode=mode, modes=modes,
                         fail_directions=fail_directions, ask_human=ask_human)
        self._http = httpx.AsyncClient(base_url=url.rstrip("/"),
                                       headers=self._headers(api_key), transport=transport)

    async def __aenter__(self) -> AsyncGate:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _drive(self, steps: Steps[T], abort: asyncio.Event | None = None) -> T:
        sent: Any = None
        while True:
            try:
                step = steps.send(sent)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if isinstance(step, Http):
                sent = await _until_aborted(self._request(step), abort, _ABORTED)
            elif isinstance(step, Sleep):
                await _until_aborted(asyncio.sleep(step.seconds), abort, None)
                sent = None
            else:
                try:
                    value = step.fn(**step.args)
                    if inspect.isawaitable(value):
                        value = await value
                    sent = Ran(value)
                except Exception as exc:  # noqa: BLE001 - reported, then re-raised
                    sent = Raised(exc)

    async def _request(self, step: Http) -> Reply | Failure:
        try:
            return _reply(await self._http.request(step.method, step.path,
                                                   **_request_kwargs(step)))
        except httpx.HTTPError as exc:
            return _failure(exc)

    async def decide(self, tool: str, args: dict[str, Any], **kwargs: Any) -> Decision:
        """See :meth:`Gate.decide`."""
        abort = kwargs.pop("abort", None)
        return await self._drive(self._p.decide(tool, args, **kwargs), abort)

    async def wait_for_approval(self, approval: Decision | Approval | str, *,
                                timeout: float | None = None,
                                abort: asyncio.Event | None = None) -> Approval:
        """See :meth:`Gate.wait_for_approval`."""
        return await self._drive(self._p.wait_for_approval(approval, timeout=timeout),
                                 abort)

    async def redeem(self, permit: Permit | str, tool: str, args: dict[str, Any], *,
                     abort: asyncio.Event | None = None) -> Redemption:
        """See :meth:`Gate.redeem`."""
        return await self._drive(self._p.redeem(permit, tool, args), abort)

    async def report_outcome(self, decision: Decision | str, outcome: Outcome,
                             side_effect: SideEffect, *, cost_minor: int | None = None
                             ) -> OutcomeReport:
        """See :meth:`Gate.report_outcome`."""
        return await self._drive(self._p.report_outcome(decision, outcome, side_effect,
                                                        cost_minor=cost_minor))

    async def tools(self) -> Catalogue:
        """See :meth:`Gate.tools`."""
        return await self._drive(self._p.tools())

    async def start_run(self, run_id: str | None = None, *,
                        allowed_tools: Collection[str] | None = None,
                        tool_limits: Mapping[str, int] | None = None,
                        max_tool_calls: int | None = None, max_cost: int | None = None,
                        deadline: datetime | str | None = None) -> Run:
        """See :meth:`Gate.start_run`."""
        return await self._drive(self._p.start_run(
            run_id, allowed_tools=allowed_tools, tool_limits=tool_limits,
            max_tool_calls=max_tool_calls, max_cost=max_cost, deadline=deadline))

    async def call(self, tool: str, args: dict[str, Any], fn: Callable[..., Any],
                   **kwargs: Any) -> CallResult:
        """See :meth:`Gate.call`; ``fn`` may return an awaitable."""
        abort = kwargs.pop("abort", None)
        return self._note(await self._drive(self._call_steps(tool, args, fn, kwargs),
                                            abort))

    def guard(self, tool: str, **kwargs: Any
              ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
        """Decorator for async tool functions; see :meth:`Gate.guard`."""
        def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
            @functools.wraps(fn)
            async def wrapper(*a: P.args, **kw: P.kwargs) -> R:
                args = _bind(fn, a, kw)
                result = await self.call(tool, args, fn, **kwargs)
                return result.unwrap()  # type: ignore[no-any-return]
            return wrapper
        return decorate
