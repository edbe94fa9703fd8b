"""Typed results of the three gates (frozen dataclasses built from the server's JSON)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from cosigner_client.errors import CallRefused, GateError

Effect = Literal["allow", "deny", "require_approval"]
ApprovalStatus = Literal["pending", "approved", "rejected", "expired", "cancelled"]
Outcome = Literal["ok", "error", "timeout"]
SideEffect = Literal["none", "committed", "not_executed", "unknown"]


@dataclass(frozen=True, slots=True)
class Reason:
    code: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class Permit:
    """A signed, single-use permit (compact JWS) bound to tenant, tool and args hash."""

    token: str
    jti: str
    expires_at: str | None = None

    @classmethod
    def from_token(cls, token: str) -> Permit:
        """A permit from its token alone; ``jti``/``exp`` read from the (unverified) payload."""
        try:
            payload = token.split(".")[1]
            claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            return cls(token=token, jti=str(claims["jti"]), expires_at=None)
        except (IndexError, KeyError, ValueError, TypeError):
            raise GateError("not a compact JWS permit", code="malformed_permit") from None

    @classmethod
    def parse(cls, data: Any) -> Permit | None:
        if not isinstance(data, dict) or not isinstance(data.get("token"), str):
            return None
        return cls(token=data["token"], jti=str(data.get("jti", "")),
                   expires_at=data.get("expires_at"))


@dataclass(frozen=True, slots=True)
class Approval:
    """An approval request's state (``GET /v1/approvals/{id}``).

    ``error`` is set when the client stopped waiting (``timeout``) or could not ask
    (``unavailable``, ``breaker_open``); the state is then the last one seen.
    """

    id: str
    status: ApprovalStatus
    require: tuple[dict[str, Any], ...] = ()
    progress: tuple[dict[str, Any], ...] = ()
    expires_at: str | None = None
    review_url: str | None = None
    permit: Permit | None = None
    retry_after: int | None = None
    error: GateError | None = None

    @property
    def approved(self) -> bool:
        return self.status == "approved" and self.permit is not None

    @property
    def terminal(self) -> bool:
        return self.status != "pending"

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Approval:
        return cls(id=str(data["id"]), status=data["status"],
                   require=tuple(data.get("require") or ()),
                   progress=tuple(data.get("progress") or ()),
                   expires_at=data.get("expires_at"), review_url=data.get("review_url"),
                   permit=Permit.parse(data.get("permit")), retry_after=data.get("retry_after"))


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer of the decide gate.

    A decision the client made up because the server could not answer has
    ``decision_id=None`` and ``error`` set; it is a ``deny`` unless the gate was told by
    name to proceed for this tool (``fail_open=True``, reason ``proceeded_on_timeout``).
    """

    effect: Effect
    reasons: tuple[Reason, ...]
    args_hash: str
    request_id: str
    decision_id: str | None = None
    policy: dict[str, str] | None = None
    permit: Permit | None = None
    approval: Approval | None = None
    error: GateError | None = None
    fail_open: bool = False
    #: When ``error`` is set: the fail direction taken (``deny``, ``ask``, ``proceed``).
    fail_direction: str | None = None

    @property
    def allowed(self) -> bool:
        return self.effect == "allow"

    @property
    def needs_approval(self) -> bool:
        return self.effect == "require_approval"

    @property
    def reason(self) -> str:
        """The first reason code (``""`` when none)."""
        return self.reasons[0].code if self.reasons else ""

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Decision:
        approval = data.get("approval")
        return cls(
            effect=data["effect"],
            reasons=tuple(Reason(str(r.get("code", "")), str(r.get("message", "")))
                          for r in data.get("reasons") or ()),
            args_hash=data["args_hash"], request_id=data["request_id"],
            decision_id=data["decision_id"], policy=data.get("policy"),
            permit=Permit.parse(data.get("permit")),
            approval=Approval.parse(approval) if isinstance(approval, dict) and "id" in approval
            else None)


@dataclass(frozen=True, slots=True)
class Redemption:
    """The answer of the redeem gate. Execute the tool only when ``ok``.

    ``recovered`` is true when the response was lost and the client learned from the
    permit's state that the redeem was its own.
    """

    ok: bool
    jti: str
    error: GateError | None = None
    redeemed_at: str | None = None
    recovered: bool = False

    @property
    def code(self) -> str:
        return "redeemed" if self.ok else (self.error.code if self.error else "refused")


@dataclass(frozen=True, slots=True)
class OutcomeReport:
    """The answer of the report gate (``ok`` false: not recorded, see ``error``)."""

    ok: bool
    decision_id: str | None
    outcome: Outcome
    side_effect: SideEffect
    cost_minor: int | None = None
    error: GateError | None = None


CallStatus = Literal["executed", "denied", "approval_rejected", "approval_expired",
                     "approval_cancelled", "approval_timeout", "approval_pending",
                     "redeem_refused", "proceeded_on_timeout", "approved_by_human_on_failure",
                     "shadow", "off"]


@dataclass(frozen=True, slots=True)
class CallResult:
    """What ``call``/``guard`` did: the gates' answers and, when it ran, the tool's value."""

    status: CallStatus
    decision: Decision
    value: Any = None
    approval: Approval | None = None
    redemption: Redemption | None = None
    outcome: OutcomeReport | None = None
    #: The fail direction applied when the server could not decide (``deny``, ``ask``,
    #: ``proceed``); ``None`` when it decided.
    fail_direction: str | None = None

    @property
    def executed(self) -> bool:
        """The body ran: through the gates, opted in on timeout or by a human on a
        failure, or in a site mode that does not enforce (``shadow``: Cosigner asked and
        recorded, ``decision`` is what would have happened; ``off``: Cosigner not asked)."""
        return self.status in ("executed", "proceeded_on_timeout",
                               "approved_by_human_on_failure", "shadow", "off")

    @property
    def failure(self) -> str | None:
        """The failure kind that decided this result (``errors.FAILURE_KINDS``), if any."""
        for part in (self.redemption, self.approval, self.decision):
            error = getattr(part, "error", None)
            if error is not None:
                return str(error.kind)
        return None

    @property
    def code(self) -> str:
        """Why the body did not run: the decisive gate's code (``""`` when it ran)."""
        if self.executed:
            return ""
        if self.redemption is not None:
            return self.redemption.code
        if self.approval is not None:
            return self.approval.error.code if self.approval.error else self.approval.status
        if self.decision.error is not None:
            return self.decision.error.code
        return self.decision.reason or self.decision.effect

    def unwrap(self) -> Any:
        """The tool's return value; raises :class:`CallRefused` when it did not run."""
        if not self.executed:
            raise CallRefused(f"{self.status}: {self.code}", code=self.code)
        return self.value


@dataclass(frozen=True, slots=True)
class Run:
    """A run contract with its live counters (``POST /v1/runs``)."""

    run_id: str
    contract: dict[str, Any]
    tool_calls: int = 0
    cost_minor: int = 0
    tool_counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Run:
        return cls(run_id=data["run_id"], contract=data["contract"],
                   tool_calls=data.get("tool_calls", 0), cost_minor=data.get("cost_minor", 0),
                   tool_counts=data.get("tool_counts") or {})


@dataclass(frozen=True, slots=True)
class Catalogue:
    """The tools of the tenant's active bundle (``GET /v1/tools``).

    ``tools`` maps tool name → side-effect class, or is ``None`` when the bundle has no
    catalogue (nothing can be said before a decision); ``policy`` is ``None`` when no
    bundle serves the tenant (every call is denied). A name missing from ``tools`` is
    denied ``unknown_tool`` whatever its arguments.
    """

    policy: dict[str, str] | None
    tools: dict[str, str] | None

    def denies_outright(self, tool: str) -> bool:
        """True when every call of ``tool`` is denied, whatever its arguments."""
        return self.policy is None or (self.tools is not None and tool not in self.tools)

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Catalogue:
        tools = data.get("tools")
        return cls(policy=data.get("policy"),
                   tools=None if tools is None else {str(t["name"]): str(t["side_effect"])
                                                     for t in tools})
