"""One ``tools/call`` through Cosigner: decide → wait for approval → redeem → forward →
report. Everything that is not a successful redeem ends in a tool error result and the
MCP server is never called (fail closed).

The arguments hashed, redeemed and forwarded are the very object the client sent; the
request goes to the server unchanged. ``run`` is the gate session's run (one id per
gate process), ``step`` counts its tool calls, and principal/initiator come from the
gate's own configuration, never from the arguments.

An approval still pending when the gate stops waiting is remembered for the session:
calling the same tool with the same arguments again resumes waiting on it (and runs
at once if it was approved meanwhile) instead of opening another request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp_types import JSONRPCError, JSONRPCRequest, JSONRPCResponse

from cosigner_client.canonical import args_hash
from cosigner_client.errors import GateError
from cosigner_client.gate import AsyncGate
from cosigner_client.mcp_gate import results
from cosigner_client.models import Approval, Decision, Permit
from cosigner_client.models import Outcome as OutcomeKind
from cosigner_client.models import SideEffect as SideEffectKind

log = logging.getLogger("cosigner_client.mcp_gate")

Reply = JSONRPCResponse | JSONRPCError
Forward = Callable[[JSONRPCRequest], Awaitable[Reply]]
Progress = Callable[[float, float | None, str], Awaitable[None]]


class ServerGone(Exception):
    """The MCP server is not running (exited, crashed). ``sent``: the call had reached it."""

    def __init__(self, why: str, *, sent: bool = False) -> None:
        super().__init__(why)
        self.sent = sent


@dataclass
class CallSettings:
    """Per-session settings of the tools/call gate. Times in seconds."""

    run_id: str
    approval_timeout: float = 300.0
    progress_interval: float = 5.0
    _step: int = 0
    _pending: dict[tuple[str, str], Decision] = field(default_factory=dict)

    def next_step(self) -> int:
        self._step += 1
        return self._step


async def gate_call(gate: AsyncGate, settings: CallSettings, request: JSONRPCRequest, *,
                    server: str | None, forward: Forward, progress: Progress | None) -> Reply:
    """Run ``request`` (a ``tools/call``) through the three gates; the reply for the client.

    ``forward`` sends the unchanged request to the server and returns its reply (raises
    :class:`ServerGone`); ``progress`` (when the client sent a progressToken) emits
    ``notifications/progress`` while an approval is pending. ``server`` is the server
    name that prefixes tool names (``None``: unknown, the call is refused).
    """
    params = request.params or {}
    name, arguments = params.get("name"), params.get("arguments")
    tool = f"{server}.{name}" if server and isinstance(name, str) else str(name)
    if not isinstance(name, str) or not name:
        return results.gate_failed(request.id, tool, "invalid_request", "no tool name")
    if server is None:
        return results.gate_failed(request.id, tool, "unknown_server",
                                   "server name unknown: pass --server-name")
    args: dict[str, Any] = {} if arguments is None else arguments
    if type(args) is not dict:
        return results.gate_failed(request.id, tool, "invalid_args", "arguments not an object")
    try:
        key = (tool, args_hash(args))
    except GateError as exc:  # unhashable: the server would refuse it too
        return results.gate_failed(request.id, tool, exc.code, exc.detail)

    decision = settings._pending.pop(key, None)
    if decision is None:
        decision = await gate.decide(tool, args, run={"id": settings.run_id,
                                                      "step": settings.next_step()})
        log.info("decide %s → %s (%s)", tool, decision.effect,
                 ",".join(results.reason_codes(decision)))
    permit: Permit | None = decision.permit
    if decision.effect == "require_approval" and decision.approval is not None:
        approval, waited = await _wait(gate, settings, tool, decision, progress)
        if not approval.approved:
            if approval.status == "pending" and (approval.error is None
                                                 or approval.error.code == "timeout"):
                settings._pending[key] = decision
            log.info("approval %s of %s: %s", approval.id, tool, approval.status)
            return results.not_approved(request.id, tool, decision, approval, waited_s=waited)
        permit = approval.permit
    elif decision.effect != "allow":
        return results.denied(request.id, tool, decision)
    if permit is None:  # an allow without a permit: nothing to redeem, so nothing runs
        return results.denied(request.id, tool, decision)

    redemption = await gate.redeem(permit, tool, args)
    if not redemption.ok:
        await _report(gate, decision, "error", "not_executed")
        return results.redeem_refused(request.id, tool, decision, redemption.code)
    return await _execute(gate, request, tool, decision, forward)


async def _execute(gate: AsyncGate, request: JSONRPCRequest, tool: str, decision: Decision,
                   forward: Forward) -> Reply:
    """Forward the redeemed call and report what happened (also when cancelled)."""
    try:
        reply = await forward(request)
    except ServerGone as exc:
        await _report(gate, decision, "error", "unknown" if exc.sent else "not_executed")
        if not exc.sent:
            return results.server_down(request.id, tool, str(exc))
        return results.server_lost(request.id, tool, str(exc), decision)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await _report(gate, decision, "error", "unknown")
        raise
    failed = isinstance(reply, JSONRPCError) or bool(reply.result.get("isError"))
    await _report(gate, decision, "error" if failed else "ok",
                  "unknown" if failed else "committed")
    log.info("ran %s: %s", tool, "error" if failed else "ok")
    return reply


async def _wait(gate: AsyncGate, settings: CallSettings, tool: str, decision: Decision,
                progress: Progress | None) -> tuple[Approval, float]:
    """Long-poll the approval in slices, emitting progress between them."""
    assert decision.approval is not None
    approval = decision.approval
    started = time.monotonic()
    total = settings.approval_timeout
    while True:
        waited = time.monotonic() - started
        if progress is not None:
            await progress(round(waited, 3), total,
                           f"{tool} is waiting for approval ({results.requirement(approval)})"
                           + (f": {approval.review_url}" if approval.review_url else ""))
        remaining = total - waited
        if remaining <= 0:
            return approval, waited
        approval = await gate.wait_for_approval(
            approval, timeout=min(settings.progress_interval, remaining))
        if approval.status != "pending" or (approval.error is not None
                                            and approval.error.code != "timeout"):
            return approval, time.monotonic() - started


async def _report(gate: AsyncGate, decision: Decision, outcome: OutcomeKind,
                  side_effect: SideEffectKind) -> None:
    report = await gate.report_outcome(decision, outcome, side_effect)
    if not report.ok:
        log.warning("outcome of decision %s not recorded: %s", decision.decision_id,
                    report.error)
