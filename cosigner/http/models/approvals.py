"""Wire models of approvals, reviews and permit redemption, v1 (``extra="forbid"``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from cosigner.http.models.decisions import (
    TEXT_PATTERN,
    TOOL_PATTERN,
    PartyV1,
    PermitV1,
    ReasonV1,
    RunRefV1,
    Wire,
)

ApprovalStatus = Literal["pending", "approved", "rejected", "expired", "cancelled"]
#: What ``GET /v1/approvals?status=`` filters on: a state, or ``after_review`` (break-glass
#: authorisations whose mandatory review is still open).
ApprovalFilter = Literal["pending", "approved", "rejected", "expired", "cancelled",
                         "after_review"]
#: Ids we issue (UUIDv7 strings, hex jti; cosigner.core.ids): nothing else can name a row.
ID_PATTERN = r"^[A-Za-z0-9_-]+$"


class StandingConstraintV1(Wire):
    pointer: str = Field(min_length=1, max_length=512, pattern=r"^/",
                         description="JSON pointer (RFC 6901) into the call's args.")
    op: Literal["equals", "max", "min"]
    value: Any = Field(description="equals: any JSON (RFC 8785 equality); max/min: a number.")


class StandingGrantV1(Wire):
    """Extend this approval to later matching calls (bounded by the policy's ``standing``)."""

    scope: Literal["run", "ttl"] = Field(description="run: later calls in this run; ttl: in "
                                                     "any run, until ttl_s has passed.")
    ttl_s: int | None = Field(default=None, ge=1, description="At most the policy's "
                              "max_ttl_s (the default for scope run).")
    max_uses: int | None = Field(default=None, ge=1,
                                 description="At most the policy's max_uses (the default).")
    constraints: list[StandingConstraintV1] = Field(min_length=1, max_length=16)


class ReviewRequestV1(Wire):
    """An approver's review. Who reviews comes from the credential, never from the body
    (``requested_by``, ``approver`` ... are unknown fields: 422)."""

    decision: Literal["approved", "rejected"]
    comment: str = Field(default="", max_length=2000, pattern=TEXT_PATTERN,
                         description="Required (non-blank) when rejecting.")
    standing: StandingGrantV1 | None = Field(
        default=None, description="Approve later matching calls too (when the policy's "
                                  "requirement allows standing approvals).")


class ReviewAskV1(Wire):
    """A runtime asks for human review of a call the policy allowed."""

    decision_id: str = Field(min_length=1, max_length=36, pattern=ID_PATTERN)
    reason: str = Field(min_length=1, max_length=500, pattern=TEXT_PATTERN)


class RoleGroupAskV1(Wire):
    role: str = Field(min_length=1, max_length=64, pattern=TEXT_PATTERN)
    count: int = Field(default=1, ge=1, le=100)


class BarrierAskV1(Wire):
    """Trusted runtime code (role ``barrier``) opens a program barrier: an approval over
    ``context``; the policy may raise the requirement, never lower it."""

    run: RunRefV1
    context: dict[str, Any] = Field(description="The JSON document to review; bound by "
                                    "its RFC 8785 hash, masked per policy.")
    require: list[RoleGroupAskV1] = Field(min_length=1, max_length=16)
    timeout_ms: int = Field(ge=1, le=2_592_000_000)
    distinct_from: Literal["initiator", "previous", "initiator_and_previous"] = \
        "initiator_and_previous"
    principal: PartyV1 | None = None
    initiator: PartyV1 | None = None


class WithdrawRejectionV1(Wire):
    """An approver or admin withdraws a rejection (who: from the credential)."""

    reason: str = Field(min_length=1, max_length=500, pattern=TEXT_PATTERN)


class BreakGlassRequestV1(Wire):
    """A ``breakglass`` principal authorises a pending request alone (who: the credential)."""

    reason: str = Field(min_length=1, max_length=2000, pattern=TEXT_PATTERN,
                        description="Why; at least break_glass_min_reason_chars characters.")


class AfterReviewRequestV1(Wire):
    """An approver's after-the-fact review of a break-glass authorisation."""

    verdict: Literal["upheld", "objected"]
    comment: str = Field(min_length=1, max_length=2000, pattern=TEXT_PATTERN)


class BreakGlassV1(BaseModel):
    by: dict[str, Any]
    reason: str
    at: str


class AfterReviewedV1(BaseModel):
    by: dict[str, Any]
    verdict: Literal["upheld", "objected"]
    comment: str
    at: str


class RoleGroupV1(BaseModel):
    role: str
    count: int
    signature: Literal["webauthn"] | None = Field(
        default=None, exclude_if=lambda v: v is None,  # pydantic >= 2.12
        description="Each approval counted here is signed by the approver's own passkey "
                    "(README § Signed approvals); absent when not asked.")


class StageV1(BaseModel):
    require: list[RoleGroupV1]
    timeout_ms: int
    distinct_from: Literal["initiator", "previous", "initiator_and_previous"]


class StepUpV1(BaseModel):
    """What the current stage asks of its reviewers' sign-in (README § Step-up)."""

    assurance: Literal["mfa"] | None = None
    min_acr: str | None = None
    max_auth_age_s: int | None = None


class GroupProgressV1(BaseModel):
    role: str
    count: int
    approved: int = Field(description="Distinct people counted for this group so far.")


class ReviewV1(BaseModel):
    subject: str
    decision: Literal["approved", "rejected"]
    role: str | None = Field(description="Group the approval counts for (null: rejection).")
    stage: int | None = Field(default=None, description="Escalation stage it was given in.")
    comment: str
    at: str
    signed: bool = Field(default=False, description="Signed with the reviewer's passkey.")


class ApprovalV1(BaseModel):
    """An approval request's state. ``args`` are shown with masked paths as ``•••``."""

    id: str
    status: ApprovalStatus
    require: list[RoleGroupV1]
    progress: list[GroupProgressV1]
    distinct_from: Literal["initiator", "previous", "initiator_and_previous"]
    expires_at: str
    review_url: str
    stage: int | None = Field(default=None, description="Escalation stage (1: the first); "
                                                        "require/expires_at are this stage's.")
    on_expired: StageV1 | None = Field(default=None, description="The next stage when this "
                                       "one times out; null: the request then expires.")
    step_up: StepUpV1 | None = Field(default=None, description="The current stage's step-up "
                                     "(null: none); API keys and passwords never meet it.")
    kind: Literal["policy", "runtime_review", "barrier"] | None = None
    decision_id: str | None = None
    run_id: str | None = None
    tool: str | None = None
    args: Any = None
    args_hash: str | None = None
    masked_paths: list[str] | None = None
    initiator: dict[str, Any] | None = None
    principal: dict[str, Any] | None = None
    reasons: list[ReasonV1] | None = None
    reason: str | None = None
    policy: dict[str, str] | None = None
    created_at: str | None = None
    decided_at: str | None = None
    superseded_by: str | None = Field(
        default=None, description="Set on a request cancelled because it was superseded "
                                  "(README § Approvals and permits): the request of the "
                                  "same call that replaced it, to read or wait on instead.")
    rejection_withdrawn_at: str | None = Field(
        default=None, description="When a rejection was withdrawn; until then the same "
                                  "call in the run is denied rejected_by_reviewer.")
    reviews: list[ReviewV1] | None = None
    barrier: dict[str, Any] | None = Field(
        default=None, description="A program barrier just opened: the requirement the "
        "program asked for, the effective one (raised by the policy), and whether it was "
        "raised.")
    break_glass: BreakGlassV1 | None = Field(default=None, description="Set when a "
                                             "breakglass principal authorised it alone.")
    after_review: Literal["open", "done"] | None = Field(
        default=None, description="The mandatory review after break-glass: open until an "
                                  "approver records it.")
    after_reviewed: AfterReviewedV1 | None = None
    retry_after: int | None = Field(default=None,
                                    description="Seconds before polling again (pending).")
    permit_status: Literal["issued", "redeemed", "revoked", "expired"] | None = Field(
        default=None, description="State of the permit minted on approval (null: none).")
    permit: PermitV1 | None = Field(
        default=None, description="Once approved; runtime callers only; null once the "
                                  "permit was revoked (see permit_status).")


class StandingApprovalV1(BaseModel):
    id: str
    approval_id: str
    tool: str
    principal_id: str
    scope: Literal["run", "ttl"]
    run_id: str | None
    constraints: list[dict[str, Any]]
    roles: list[str]
    max_uses: int
    uses: int
    created_by: str
    created_at: str
    expires_at: str
    revoked_at: str | None


class StandingApprovalListV1(BaseModel):
    items: list[StandingApprovalV1]


class ApprovalListV1(BaseModel):
    items: list[ApprovalV1]


class RedeemRequestV1(Wire):
    """Redeem a permit for the exact call about to run."""

    permit: str = Field(min_length=1, max_length=16_384, description="The compact JWS.")
    tool: str = Field(min_length=1, max_length=256, pattern=TOOL_PATTERN)
    args: dict[str, Any] = Field(description="The exact arguments about to be executed.")


class RedemptionV1(BaseModel):
    status: Literal["redeemed"]
    jti: str
    decision_id: str
    approval_id: str | None
    tool: str
    args_hash: str
    redeemed_at: str


class PermitRevocationV1(BaseModel):
    jti: str
    status: Literal["revoked"]
