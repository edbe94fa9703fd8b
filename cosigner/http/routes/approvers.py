"""Routes for approver passkeys: the key export executors check signatures against, and
their administration. Rules live in :mod:`cosigner.identity.passkeys`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from cosigner.http.deps import PROBLEM_RESPONSES, CallerDep, context
from cosigner.identity import passkeys

router = APIRouter(prefix="/v1", tags=["approvers"])

_RESPONSES = {**PROBLEM_RESPONSES, 404: PROBLEM_RESPONSES[409] | {"description": "Not found"}}


class ApproverKeyV1(BaseModel):
    kid: str = Field(description="The WebAuthn credential id (base64url).")
    sub: str = Field(description="The approver's subject (canonical form).")
    cose: str = Field(description="The COSE_Key public key (base64url), as registered.")
    kty: str
    alg: str = Field(description="ES256, EdDSA or RS256.")
    crv: str | None = None
    x: str | None = None
    y: str | None = None
    n: str | None = None
    e: str | None = None
    created_at: str | None
    removed_at: str | None = Field(description="When it was removed (it signs nothing "
                                               "after); null while live.")


class ApproverKeysV1(BaseModel):
    rp_id: str = Field(description="WebAuthn relying party id (host of the public URL).")
    origin: str = Field(description="The origin assertions must name.")
    keys: list[ApproverKeyV1]


class ApproverCredentialV1(BaseModel):
    credential_id: str
    subject: str
    name: str
    alg: int = Field(description="COSE algorithm (-7 ES256, -8 EdDSA, -257 RS256).")
    aaguid: str
    fmt: str = Field(description="Attestation statement format.")
    created_at: str | None
    last_used_at: str | None
    removed_at: str | None


class ApproverCredentialListV1(BaseModel):
    items: list[ApproverCredentialV1]


@router.get("/approvers/keys", response_model=ApproverKeysV1, responses=PROBLEM_RESPONSES)
async def get_approver_keys(request: Request, caller: CallerDep) -> dict[str, Any]:
    """The caller's tenant's approver passkeys as a JWK-Set-like export (any role).

    Public keys only; removed ones stay listed with ``removed_at``. An executor checks a
    permit's signed ``approvers`` against it (``cosigner_client.approver_signatures``).
    """
    ctx = context(request)
    return await passkeys.approver_keys(ctx.db, caller.tenant,
                                        passkeys.relying_party(ctx.settings.public_url))


@router.get("/approvers/credentials", response_model=ApproverCredentialListV1,
            responses=PROBLEM_RESPONSES)
async def list_approver_credentials(request: Request, caller: CallerDep) -> dict[str, Any]:
    """Every live approver passkey of the tenant (admin role)."""
    ctx = context(request)
    return {"items": await passkeys.list_credentials(ctx.db, caller, everyone=True)}


@router.delete("/approvers/credentials/{credential_id}", response_model=ApproverCredentialV1,
               responses=_RESPONSES)
async def delete_approver_credential(
        request: Request, caller: CallerDep,
        credential_id: str = Path(min_length=1, max_length=1400,
                                  pattern=r"^[A-Za-z0-9_-]+$")) -> dict[str, Any]:
    """Remove an approver's passkey (admin role); logged ``passkey.removed``. 404 when
    there is no live passkey of that id in the tenant."""
    caller.require("admin")
    ctx = context(request)
    return await passkeys.remove_credential(ctx.db, ctx.clock, caller, credential_id)
