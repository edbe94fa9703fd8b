"""Wire models of the audit API, v1."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class AuditEventV1(BaseModel):
    """One decision-log event: its hashed body (schema_version 1) plus ``hash``."""

    schema_version: int
    type: str
    tenant: str
    seq: int
    time: str = Field(description="RFC 3339 UTC.")
    actor: dict[str, Any]
    subject: dict[str, str] = Field(description="decision_id, approval_id, permit_jti, run_id.")
    tool: str | None = None
    args_hash: str | None = None
    effect: str | None = None
    policy: dict[str, str] | None = None
    payload: dict[str, Any] = Field(description="Masked; lists masked_paths.")
    prev_hash: str
    hash: str = Field(description="sha256 of the RFC 8785 form of every other member.")


class AuditEventPageV1(BaseModel):
    events: list[AuditEventV1]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; "
                                                "null on the last page.")


class CheckpointV1(BaseModel):
    """A signed statement that event ``seq`` of ``tenant`` has hash ``hash``."""

    tenant: str
    seq: int
    hash: str
    time: str
    kid: str
    token: str = Field(description="Compact JWS, alg Ed25519, typ cosigner-checkpoint+jwt.")


class CheckpointPageV1(BaseModel):
    checkpoints: list[CheckpointV1]
    next_cursor: str | None = None


class CheckpointResultV1(BaseModel):
    checkpoint: CheckpointV1 | None = Field(description="null when the tenant has no events.")
