"""Wire models, v1. Unknown fields are rejected everywhere (``extra="forbid"``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Text that reaches a database text column: any character but NUL (PostgreSQL text cannot
#: hold it; one such value would fail the whole group-commit batch it lands in).
TEXT_PATTERN = r"^[^\x00]*$"
#: Tool names, as the catalogue and permits spell them.
TOOL_PATTERN = r"^[A-Za-z0-9_.:/-]+$"


class Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class RunRefV1(Wire):
    id: str = Field(min_length=1, max_length=256, pattern=TEXT_PATTERN)
    step: int | None = Field(default=None, ge=0)
    trace_id: str | None = Field(default=None, max_length=256, pattern=TEXT_PATTERN)


class PartyV1(Wire):
    """A principal (on whose behalf) or initiator (who proposed), attested by the runtime."""

    id: str = Field(min_length=1, max_length=256, pattern=TEXT_PATTERN)
    type: str = Field(default="user", min_length=1, max_length=64, pattern=TEXT_PATTERN)


class ToolRefV1(Wire):
    name: str = Field(min_length=1, max_length=256, pattern=TOOL_PATTERN)
    version: str | None = Field(default=None, max_length=64, pattern=TEXT_PATTERN)
    side_effect: Literal["none", "read", "write", "financial", "destructive"] | None = None


class DecisionRequestV1(Wire):
    """Ask whether a proposed tool call may run. ``tenant`` comes from the API key."""

    request_id: str = Field(min_length=1, max_length=256, pattern=TEXT_PATTERN,
                            description="Client-chosen idempotency key.")
    run: RunRefV1
    principal: PartyV1
    initiator: PartyV1
    tool: ToolRefV1
    args: dict[str, Any] = Field(description="The exact tool arguments (a JSON object).")
    context: dict[str, Any] = Field(default_factory=dict,
                                    description="Facts the runtime asserts.")
    mode: Literal["on", "shadow"] = Field(
        default="on", description="``shadow``: decide and record (marked ``mode: shadow``) "
        "but never mint a permit nor open an approval request; the client runs the tool "
        "anyway and reports what would have happened.")


class ReasonV1(BaseModel):
    code: str
    message: str = ""


class PolicyRefV1(BaseModel):
    id: str
    version: str
    revision: str = Field(description="sha256 digest of the bundle's files.")


class PermitV1(BaseModel):
    token: str = Field(description="Compact JWS (alg Ed25519, RFC 9864).")
    jti: str
    expires_at: str


class DecisionV1(BaseModel):
    decision_id: str
    request_id: str
    effect: Literal["allow", "deny", "require_approval"]
    reasons: list[ReasonV1]
    policy: PolicyRefV1 | None
    args_hash: str
    permit: PermitV1 | None = None
    approval: dict[str, Any] | None = None
    mode: Literal["shadow"] | None = Field(default=None,
                                           description="present for shadow decisions")


class ProblemV1(BaseModel):
    """RFC 9457 problem document."""

    type: str
    title: str
    status: int
    detail: str
    code: str


class HealthV1(BaseModel):
    status: str
    checks: dict[str, Any] = Field(default_factory=dict)
