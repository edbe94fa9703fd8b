"""Wire models (v1) of run contracts, outcome reports and permit state (issue 7)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from cosigner.http.models.decisions import TEXT_PATTERN, TOOL_PATTERN, Wire

_MAX_SAFE = 2**53 - 1
ToolName = Field(min_length=1, max_length=256, pattern=TOOL_PATTERN)


class BudgetV1(Wire):
    max_tool_calls: int | None = Field(default=None, ge=0, le=_MAX_SAFE,
                                       description="Calls (allow or require_approval).")
    max_cost: int | None = Field(default=None, ge=0, le=_MAX_SAFE,
                                 description="Minor units: reported costs, plus a call's declared "
                                             "cost when cost_args names it.")


class RunContractV1(Wire):
    """Register what a run may do. Identical re-registration is idempotent; any other
    contract for the same run is refused (409 ``contract_conflict``)."""

    run_id: str = Field(min_length=1, max_length=256, pattern=TEXT_PATTERN)
    allowed_tools: list[str] | None = Field(
        default=None, max_length=1000, description="Tool names; omitted/null = any tool.")
    tool_limits: dict[str, int] = Field(
        default_factory=dict, description="Per tool: the most calls counted in this run.")
    budget: BudgetV1 | None = None
    cost_args: dict[str, str] = Field(
        default_factory=dict, max_length=1000,
        description="Per tool: JSON pointer (RFC 6901) to the argument declaring the call's "
                    "expected cost (integer, minor units), checked against max_cost before "
                    "the call is allowed.")
    deadline: str | None = Field(default=None, max_length=64,
                                 description="RFC 3339 timestamp, e.g. 2030-01-01T00:00:00Z.")


class RunContractTermsV1(BaseModel):
    allowed_tools: list[str] | None
    tool_limits: dict[str, int]
    budget: dict[str, int | None]
    cost_args: dict[str, str] | None = None
    deadline: str | None


class RunV1(BaseModel):
    run_id: str
    contract: RunContractTermsV1
    tool_calls: int
    cost_minor: int
    tool_counts: dict[str, int]
    created_at: str | None


class OutcomeReportV1(Wire):
    """What happened after a decision. One per decision (identical retry = 200)."""

    outcome: Literal["ok", "error", "timeout"]
    side_effect: Literal["none", "committed", "not_executed", "unknown"]
    cost_minor: int | None = Field(default=None, ge=0, le=_MAX_SAFE,
                                   description="Minor units, counted against the run budget.")


class OutcomeV1(BaseModel):
    decision_id: str
    run_id: str
    outcome: str
    side_effect: str
    cost_minor: int | None
    reported_at: str


class PermitStateV1(BaseModel):
    jti: str
    status: Literal["issued", "redeemed", "revoked", "expired"]
    tool: str
    args_hash: str
    run_id: str
    decision_id: str
    approval_id: str | None
    expires_at: str | None
    redeemed_at: str | None
    redeemed_by_you: bool
