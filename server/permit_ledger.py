"""Permit state in the database: issue (mint + row + event); redeem and revoke.

A permit is ``issued → redeemed | revoked | expired``. The row is the server's own
state; the signed token alone never proves a permit is still usable (case K10).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from server.audit.chain import Event
from server.db.tables import permits as permits_table
from server.keys import Keyring
from server.permits import mint_permit
from server.settings import Settings


async def issue(
    conn: AsyncConnection, keyring: Keyring, settings: Settings, *, tenant: str, run_id: str,
    decision_id: str, approval_id: str | None, tool: str, args_hash: str,
    policy: dict[str, str], approvers: list[dict[str, Any]], now: datetime, ttl_s: int,
    actor: dict[str, Any],
) -> tuple[dict[str, Any], Event]:
    """Mint a permit, store its row in the open transaction, and return
    ``({token, jti, expires_at}, permit.minted event)``. ``ttl_s`` in seconds."""
    token, claims = mint_permit(
        keyring, issuer=settings.issuer, audience=settings.audience, tenant=tenant,
        run_id=run_id, decision_id=decision_id, approval_id=approval_id, tool=tool,
        args_hash=args_hash, policy=policy, approvers=approvers, now=now, ttl_s=ttl_s)
    expires_at = datetime.fromtimestamp(claims.exp, UTC)
    await conn.execute(permits_table.insert().values(
        jti=claims.jti, tenant=tenant, decision_id=decision_id, approval_id=approval_id,
        run_id=run_id, tool=tool, args_hash=args_hash, status="issued", issued_at=now,
        expires_at=expires_at))
    event = Event(type="permit.minted", actor=actor, decision_id=decision_id,
                  approval_id=approval_id, permit_jti=claims.jti, run_id=run_id, tool=tool,
                  args_hash=args_hash, policy=policy,
                  payload={"exp": claims.exp, "kid": keyring.current_kid,
                           "approvers": [dict(a) for a in claims.approvers]})
    permit = {"token": token, "jti": claims.jti,
              "expires_at": expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")}
    return permit, event
