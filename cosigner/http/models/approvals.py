"""Wire models of approvals, reviews and permit redemption, v1 (``extra="forbid"``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from cosigner.http.models.decisions import TEXT_PATTERN, TOOL_PATTERN, PermitV1, ReasonV1, Wire

ApprovalStatus = Literal["pending", "approved", "rejected", "expired", "cancelled"]
#: Ids we issue (uuid4, hex jti): nothing else can name a row.
ID_PATTERN = r"^[A-Za-z0-9_-]+$"


class ReviewRequestV1(Wire):
    """An approver's review. Who reviews comes from the credential, never from the body
    (``requested_by``, ``approver`` ... are unknown fields: 422)."""

    decision: Literal["approved", "rejected"]
    comment: str = Field(default="", max_length=2000, pattern=TEXT_PATTERN,
                         description="Required (non-blank) when rejecting.")


class ReviewAskV1(Wire):
    """A runtime asks for human review of a call the policy allowed."""

    decision_id: str = Field(min_length=1, max_length=36, pattern=ID_PATTERN)
    reason: str = Field(min_length=1, max_length=500, pattern=TEXT_PATTERN)


class WithdrawRejectionV1(Wire):
    """An approver or admin withdraws a rejection (who: from the credential)."""

    reason: str = Field(min_length=1, max_length=500, pattern=TEXT_PATTERN)


class RoleGroupV1(BaseModel):
    role: str
    count: int


class GroupProgressV1(BaseModel):
    role: str
    count: int
    approved: int = Field(description="Distinct people counted for this group so far.")


class ReviewV1(BaseModel):
    subject: str
    decision: Literal["approved", "rejected"]
    role: str | None = Field(description="Group the approval counts for (null: rejection).")
    comment: str
    at: str


class ApprovalV1(BaseModel):
    """An approval request's state. ``args`` are shown with masked paths as ``•••``."""

    id: str
    status: ApprovalStatus
    require: list[RoleGroupV1]
    progress: list[GroupProgressV1]
    distinct_from: Literal["initiator", "previous", "initiator_and_previous"]
    expires_at: str
    review_url: str
    kind: Literal["policy", "runtime_review"] | None = None
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
    rejection_withdrawn_at: str | None = Field(
        default=None, description="When a rejection was withdrawn; until then the same "
                                  "call in the run is denied rejected_by_reviewer.")
    reviews: list[ReviewV1] | None = None
    retry_after: int | None = Field(default=None,
                                    description="Seconds before polling again (pending).")
    permit_status: Literal["issued", "redeemed", "revoked", "expired"] | None = Field(
        default=None, description="State of the permit minted on approval (null: none).")
    permit: PermitV1 | None = Field(
        default=None, description="Once approved; runtime callers only; null once the "
                                  "permit was revoked (see permit_status).")


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
