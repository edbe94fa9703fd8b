"""Pause and resume: surface a ``require_approval`` to the framework's own interruption
mechanism, and finish the call later — in another process — from the approval id.

A framework adapter splits :meth:`Gate.call` in two:

1. :func:`check` decides (optionally under a *stable* ``request_id``, so a process that
   replays the framework's saved state gets the first decision back instead of opening a
   new approval request). ``require_approval`` becomes a :class:`Paused` value: the
   approval id, its review URL, the tool and its arguments — what the framework's
   interruption carries.
2. :func:`resume` / :func:`aresume` start from the approval id alone: they read the
   request's state from the server (``GET /v1/approvals/{id}``, optionally long-polling),
   check the call is the approved one, redeem its permit and run the tool **exactly once**
   — a second resume of the same approval finds the permit ``already_redeemed`` and does
   not run it — or report why not (``CallResult.status``/``code``).

Nothing the framework or the model hands back carries authority: a resume value that says
"approved" means nothing until Cosigner's approval says so and the single-use permit is
redeemed for exactly these arguments.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cosigner_client._core import (
    Protocol,
    Reply,
    Steps,
    error_of,
)
from cosigner_client.canonical import args_hash
from cosigner_client.errors import GateError, ServerRefused
from cosigner_client.models import (
    Approval,
    CallResult,
    CallStatus,
    Decision,
    Reason,
    Redemption,
)

if TYPE_CHECKING:
    from cosigner_client.gate import AsyncGate, Gate

__all__ = ["ApprovalPending", "Paused", "Refusal", "acheck", "aread_approval", "aresume",
           "arun_decided", "check", "read_approval", "refusal_text", "resume", "run_decided",
           "stable_request_id"]



@dataclass(frozen=True, slots=True)
class Paused:
    """A call waiting for people: what a framework interruption carries."""

    approval_id: str
    review_url: str | None
    tool: str
    args: dict[str, Any]
    decision_id: str | None = None
    expires_at: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"cosigner": "approval_required", "approval_id": self.approval_id,
                "review_url": self.review_url, "tool": self.tool, "args": self.args,
                "decision_id": self.decision_id, "expires_at": self.expires_at}


def stable_request_id(*parts: str) -> str:
    """A ``request_id`` derived from what identifies one proposed call in a run (run id,
    the framework's tool-call id, ...): deciding it again replays the first decision."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:40]
    return f"req-{digest}"


def paused_of(decision: Decision, tool: str, args: dict[str, Any]) -> Paused | None:
    """The pause a ``require_approval`` decision asks for (``None`` otherwise)."""
    if decision.effect != "require_approval" or decision.approval is None:
        return None
    a = decision.approval
    return Paused(approval_id=a.id, review_url=a.review_url, tool=tool, args=args,
                  decision_id=decision.decision_id, expires_at=a.expires_at)


def refusal_text(result: CallResult | Decision) -> str:
    """What the model reads when a call did not run: the refusal's code and reason."""
    if isinstance(result, Decision):
        result = CallResult("denied", result)
    decision = result.decision
    if result.status == "denied":
        reason = decision.reasons[0] if decision.reasons else Reason(result.code)
        why = f"{reason.code}: {reason.message}" if reason.message else reason.code
        return f"Cosigner denied this call ({why}). It was not executed."
    if result.status in ("approval_pending", "approval_timeout"):
        url = result.approval.review_url if result.approval else None
        tail = f" Review: {url}" if url else ""
        return f"This call is waiting for approval ({result.code}). It was not executed.{tail}"
    if result.status.startswith("approval_"):
        return f"A reviewer did not approve this call ({result.code}). It was not executed."
    if result.status == "redeem_refused":
        return f"The permit for this call was refused ({result.code}). It was not executed."
    return f"This call was not executed ({result.code})."


# --------------------------------------------------------------------------- check


def _check(p: Protocol, tool: str, args: dict[str, Any], kwargs: dict[str, Any]
           ) -> Steps[tuple[Decision, Paused | None]]:
    decision = yield from p.decide(tool, args, **kwargs)
    return decision, paused_of(decision, tool, args)


def check(gate: Gate, tool: str, args: dict[str, Any], **kwargs: Any
          ) -> tuple[Decision, Paused | None]:
    """Decide ``tool(args)``; ``(decision, Paused)`` when it needs approval. Keyword args
    as :meth:`Gate.decide` (pass a :func:`stable_request_id` to make it replayable)."""
    return gate._drive(_check(gate._p, tool, args, kwargs))


async def acheck(gate: AsyncGate, tool: str, args: dict[str, Any], **kwargs: Any
                 ) -> tuple[Decision, Paused | None]:
    """See :func:`check`."""
    return await gate._drive(_check(gate._p, tool, args, kwargs))


# --------------------------------------------------------------------------- resume


def _read(p: Protocol, approval_id: str) -> Steps[dict[str, Any] | GateError]:
    result = yield from p.exchange("GET", f"/v1/approvals/{approval_id}",
                                   deadline=p._clock() + p.config.timeout,
                                   retries=p.config.retries)
    if isinstance(result, Reply) and result.status == 200 and isinstance(result.data, dict):
        return result.data
    return error_of(result)


def _refused(decision: Decision, approval: Approval | None, code: str, detail: str,
             jti: str = "") -> CallResult:
    return CallResult("redeem_refused", decision, approval=approval,
                      redemption=Redemption(ok=False, jti=jti,
                                            error=ServerRefused(detail, code=code)))


def run_permitted(p: Protocol, decision: Decision, approval: Approval | None, tool: str,
                  args: dict[str, Any], fn: Callable[..., Any], *,
                  side_effect: str | None, cost_minor: Any) -> Steps[CallResult]:
    """redeem → ``fn(**args)`` → report (:meth:`Protocol.run_permitted`), for a decision
    whose permit is at hand."""
    permit = approval.permit if approval is not None else decision.permit
    if permit is None:
        return CallResult("denied", decision, approval=approval)
    return (yield from p.run_permitted(decision, approval, permit, tool, args, fn,
                                       side_effect=side_effect, cost_minor=cost_minor))


def _resume(p: Protocol, approval_id: str, fn: Callable[..., Any], *, tool: str | None,
            args: dict[str, Any] | None, wait: float, side_effect: str | None,
            cost_minor: Any) -> Steps[CallResult]:
    data = yield from _read(p, approval_id)
    if isinstance(data, dict) and data.get("status") == "pending" and wait > 0:
        yield from p.wait_for_approval(approval_id, timeout=wait)
        data = yield from _read(p, approval_id)
    if isinstance(data, GateError):
        approval = Approval(id=approval_id, status="pending", error=data)
        decision = Decision(effect="require_approval", reasons=(Reason(data.code),),
                            args_hash=args_hash(args) if args is not None else "",
                            request_id=f"resume-{approval_id}", approval=approval)
        status: CallStatus = "approval_pending"
        if isinstance(data, ServerRefused):  # unknown id, another tenant's, ...
            return _refused(decision, approval, data.code, data.detail)
        return CallResult(status, decision, approval=approval)
    approval = Approval.parse(data)
    name = str(data.get("tool", ""))
    if args is None:
        if data.get("masked_paths"):
            args = {}
        else:
            args = dict(data.get("args") or {})
    decision = Decision(effect="require_approval",
                        reasons=tuple(Reason(str(r.get("code", "")), str(r.get("message", "")))
                                      for r in data.get("reasons") or ()),
                        args_hash=str(data.get("args_hash", "")),
                        request_id=f"resume-{approval_id}",
                        decision_id=data.get("decision_id"), policy=data.get("policy"),
                        approval=approval)
    if tool is not None and tool != name:
        return _refused(decision, approval, "tool_mismatch",
                        f"approval {approval_id} is for {name}, not {tool}")
    if data.get("masked_paths") and not args:
        return _refused(decision, approval, "args_required",
                        "the approval masks some arguments; pass args to resume")
    if args_hash(args) != decision.args_hash:
        return _refused(decision, approval, "args_mismatch",
                        "arguments differ from the approved ones")
    if approval.status == "approved" and approval.permit is None:
        return _refused(decision, approval, "no_permit",
                        "the approval holds no permit for this caller (a runtime key reads it)")
    if not approval.approved:
        status = ("approval_pending" if approval.status == "pending" else
                  "approval_rejected" if approval.status == "rejected" else
                  "approval_expired" if approval.status == "expired" else
                  "approval_cancelled")
        return CallResult(status, decision, approval=approval)
    return (yield from run_permitted(p, decision, approval, name, args, fn,
                                     side_effect=side_effect, cost_minor=cost_minor))


def resume(gate: Gate, approval_id: str, fn: Callable[..., Any], *, tool: str | None = None,
           args: dict[str, Any] | None = None, wait: float = 0.0,
           side_effect: str | None = None, cost_minor: Any = None) -> CallResult:
    """Finish a paused call from its approval id: read (or, with ``wait`` > 0, long-poll)
    the approval; when approved, redeem its permit for exactly ``tool(args)`` and run
    ``fn(**args)`` once, then report. ``tool``/``args`` default to the approval's own
    (which must then mask nothing); given, they must be the approved call.

    ``status``: ``executed``; ``approval_pending`` (not decided yet); ``approval_rejected``
    / ``_expired`` / ``_cancelled``; ``redeem_refused`` with ``code`` ``already_redeemed``
    (resumed before: it did not run again), ``args_mismatch``, ``tool_mismatch``, ...
    """
    return gate._drive(_resume(gate._p, approval_id, fn, tool=tool, args=args, wait=wait,
                               side_effect=side_effect, cost_minor=cost_minor))


async def aresume(gate: AsyncGate, approval_id: str, fn: Callable[..., Any], *,
                  tool: str | None = None, args: dict[str, Any] | None = None,
                  wait: float = 0.0, side_effect: str | None = None,
                  cost_minor: Any = None) -> CallResult:
    """See :func:`resume`; ``fn`` may be sync or async."""
    return await gate._drive(_resume(gate._p, approval_id, fn, tool=tool, args=args,
                                     wait=wait, side_effect=side_effect,
                                     cost_minor=cost_minor))


def run_decided(gate: Gate, decision: Decision, tool: str, args: dict[str, Any],
                fn: Callable[..., Any], *, side_effect: str | None = None,
                cost_minor: Any = None) -> CallResult:
    """Finish an ``allow`` (redeem → run → report) or refuse a ``deny``."""
    if decision.effect != "allow":
        return CallResult("denied", decision)
    return gate._drive(run_permitted(gate._p, decision, None, tool, args, fn,
                                     side_effect=side_effect, cost_minor=cost_minor))


async def arun_decided(gate: AsyncGate, decision: Decision, tool: str, args: dict[str, Any],
                       fn: Callable[..., Any], *, side_effect: str | None = None,
                       cost_minor: Any = None) -> CallResult:
    """See :func:`run_decided`."""
    if decision.effect != "allow":
        return CallResult("denied", decision)
    return await gate._drive(run_permitted(gate._p, decision, None, tool, args, fn,
                                           side_effect=side_effect, cost_minor=cost_minor))


def _read_approval(p: Protocol, approval_id: str) -> Steps[Approval]:
    data = yield from _read(p, approval_id)
    if isinstance(data, GateError):
        return Approval(id=approval_id, status="pending", error=data)
    return Approval.parse(data)


def read_approval(gate: Gate, approval_id: str) -> Approval:
    """The approval's current state (one ``GET``; ``error`` set when it could not be read)."""
    return gate._drive(_read_approval(gate._p, approval_id))


async def aread_approval(gate: AsyncGate, approval_id: str) -> Approval:
    """See :func:`read_approval`."""
    return await gate._drive(_read_approval(gate._p, approval_id))


class Refusal(str):
    """A refusal as the model reads it: a ``str`` (so it can be a tool's return value)
    that remembers it is one (``code``, ``result``) for the result adapters."""

    code: str
    result: CallResult | None

    def __new__(cls, text: str, *, code: str = "refused", result: CallResult | None = None
                ) -> Refusal:
        self = super().__new__(cls, text)
        self.code, self.result = code, result
        return self

    @classmethod
    def of(cls, result: CallResult) -> Refusal:
        return cls(refusal_text(result), code=result.code, result=result)


class ApprovalPending(GateError):
    """Raised (when asked for) instead of waiting: the call needs people. ``paused``
    holds the approval id and review URL to resume from."""

    code = "approval_required"

    def __init__(self, paused: Paused) -> None:
        where = paused.review_url or paused.approval_id
        super().__init__(f"{paused.tool} needs approval: {where}", code="approval_required")
        self.paused = paused
