"""A HumanLayer-style decorator: ``@cosigned(gate)`` over a tool function.

    @cosigned(gate)                       # tool name: the function's name
    def issue_refund(order_id: str, amount_minor: int) -> str: ...

    issue_refund("ord_1", 250000)         # denied → "Cosigner denied this call (...)"

Every call runs decide → (approval) → redeem → the body → report. By default a refusal
becomes a string the model reads (a :class:`~cosigner_client.pause.Refusal`, so the
result adapters still mark it as an error) and a call that needs approval waits for
people (``approval_timeout``). Options:

* ``on_refusal="raise"`` raises :class:`~cosigner_client.errors.CallRefused` instead;
* ``on_approval="pause"`` does not wait: it raises
  :class:`~cosigner_client.pause.ApprovalPending` carrying the approval id and review URL;
  later, in any process, ``issue_refund.resume(approval_id)`` redeems and runs the body
  once (a second resume returns the ``already_redeemed`` refusal and does not run it).

Arguments are bound by name with defaults applied, so what is hashed is what runs. Works
on sync functions with a :class:`Gate` and on ``async def`` functions with an
:class:`AsyncGate`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Literal

from cosigner_client.errors import CallRefused
from cosigner_client.gate import AsyncGate, Gate, _bind
from cosigner_client.models import CallResult
from cosigner_client.pause import (
    ApprovalPending,
    Refusal,
    acheck,
    aresume,
    arun_decided,
    check,
    resume,
    run_decided,
)

__all__ = ["cosigned"]


def cosigned(gate: Gate | AsyncGate, name: str | None = None, *,
             on_refusal: Literal["return", "raise"] = "return",
             on_approval: Literal["wait", "pause"] = "wait",
             side_effect: str | None = None, cost_minor: Any = None,
             approval_timeout: float | None = None) -> Callable[[Callable[..., Any]], Any]:
    """Decorate a tool function; see the module docstring."""
    if on_refusal not in ("return", "raise") or on_approval not in ("wait", "pause"):
        raise ValueError("on_refusal is return|raise and on_approval wait|pause")

    def finish(result: CallResult) -> Any:
        if result.executed:
            return result.value
        if on_refusal == "raise":
            raise CallRefused(f"{result.status}: {result.code}", code=result.code)
        return Refusal.of(result)

    def decorate(fn: Callable[..., Any]) -> Any:
        tool = name or fn.__name__
        opts: dict[str, Any] = {"side_effect": side_effect, "cost_minor": cost_minor}

        if isinstance(gate, AsyncGate):
            agate = gate

            @functools.wraps(fn)
            async def awrapper(*a: Any, **kw: Any) -> Any:
                args = _bind(fn, a, kw)
                if on_approval == "wait":
                    return finish(await agate.call(tool, args, fn,
                                                   approval_timeout=approval_timeout,
                                                   **opts))
                decision, paused = await acheck(agate, tool, args, side_effect=side_effect)
                if paused is not None:
                    raise ApprovalPending(paused)
                return finish(await arun_decided(agate, decision, tool, args, fn, **opts))

            async def aresume_call(approval_id: str, *, wait: float = 0.0,
                                   args: dict[str, Any] | None = None) -> Any:
                return finish(await aresume(agate, approval_id, fn, tool=tool, args=args,
                                            wait=wait, **opts))

            awrapper.resume = aresume_call  # type: ignore[attr-defined]
            awrapper.tool_name = tool  # type: ignore[attr-defined]
            return awrapper

        if inspect.iscoroutinefunction(fn):
            raise TypeError("an async tool function needs an AsyncGate")
        sgate = gate

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            args = _bind(fn, a, kw)
            if on_approval == "wait":
                return finish(sgate.call(tool, args, fn, approval_timeout=approval_timeout,
                                         **opts))
            decision, paused = check(sgate, tool, args, side_effect=side_effect)
            if paused is not None:
                raise ApprovalPending(paused)
            return finish(run_decided(sgate, decision, tool, args, fn, **opts))

        def resume_call(approval_id: str, *, wait: float = 0.0,
                        args: dict[str, Any] | None = None) -> Any:
            return finish(resume(sgate, approval_id, fn, tool=tool, args=args, wait=wait,
                                 **opts))

        wrapper.resume = resume_call  # type: ignore[attr-defined]
        wrapper.tool_name = tool  # type: ignore[attr-defined]
        return wrapper

    return decorate
