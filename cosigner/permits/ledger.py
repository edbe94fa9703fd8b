"""Permit state in the database: issue (mint + row + event), withhold and revoke; the
stored call input. Redeeming is :mod:`cosigner.permits.redeem`.

A permit is ``issued → redeemed | revoked | expired``. The row is the server's own
state; the signed token alone never proves a permit is still usable (case K10).
Redeem re-evaluates the currently active policy on the input recorded at decision time
(``call_inputs``), so a policy tightened between approval and use stops the call.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.audit.chain import Event, append
from cosigner.audit.masking import mask_value
from cosigner.context import AppContext
from cosigner.core.clock import expiry_of
from cosigner.core.errors import Conflict, Forbidden, NotFound, PermitRefused
from cosigner.core.settings import Settings
from cosigner.db.tables import permits as permits_table
from cosigner.db.tables_approvals import call_inputs
from cosigner.identity.principals import Caller
from cosigner.keys.keyring import Keyring
from cosigner.permits.tokens import mint_permit, token_digest


def prepare_permit(
    keyring: Keyring, settings: Settings, *, tenant: str, run_id: str,
    decision_id: str, approval_id: str | None, tool: str, args_hash: str,
    policy: dict[str, str], approvers: list[dict[str, Any]], now: datetime, ttl_s: int,
    actor: dict[str, Any], break_glass: bool = False, standing_id: str | None = None,
    event_time: datetime | None = None,
) -> tuple[dict[str, Any], Event, dict[str, Any]]:
    """Mint a permit without touching the database.

    Returns ``({token, jti, expires_at}, permit.minted event, permits row values)``; the
    caller inserts the row in the transaction that records the event. ``ttl_s`` in s;
    ``event_time``: the event's time (``append``'s ``now`` when ``None``).
    """
    token, claims = mint_permit(
        keyring, issuer=settings.issuer, audience=settings.audience, tenant=tenant,
        run_id=run_id, decision_id=decision_id, approval_id=approval_id, tool=tool,
        args_hash=args_hash, policy=policy, approvers=approvers, now=now, ttl_s=ttl_s,
        break_glass=break_glass, standing_id=standing_id)
    expires_at, expires_text = expiry_of(claims.exp)
    row = {"jti": claims.jti, "tenant": tenant, "decision_id": decision_id,
           "approval_id": approval_id, "run_id": run_id, "tool": tool,
           "args_hash": args_hash, "status": "issued", "issued_at": now,
           "expires_at": expires_at, "redeemed_at": None, "revoked_at": None,
           "token_digest": token_digest(token)}
    event = Event(type="permit.minted", actor=actor, decision_id=decision_id,
                  approval_id=approval_id, permit_jti=claims.jti, run_id=run_id, tool=tool,
                  args_hash=args_hash, policy=policy,
                  payload={"exp": claims.exp, "kid": keyring.current_kid,
                           "approvers": [dict(a) for a in claims.approvers],
                           **({"break_glass": True} if break_glass else {}),
                           **({"standing_id": standing_id} if standing_id else {})},
                  time=event_time)
    permit = {"token": token, "jti": claims.jti,
              "expires_at": expires_text}
    return permit, event, row


async def issue(
    conn: AsyncConnection, keyring: Keyring, settings: Settings, *, tenant: str, run_id: str,
    decision_id: str, approval_id: str | None, tool: str, args_hash: str,
    policy: dict[str, str], approvers: list[dict[str, Any]], now: datetime, ttl_s: int,
    actor: dict[str, Any], break_glass: bool = False,
) -> tuple[dict[str, Any], Event]:
    """Mint a permit, store its row in the open transaction, and return
    ``({token, jti, expires_at}, permit.minted event)``. ``ttl_s`` in seconds."""
    permit, event, row = prepare_permit(
        keyring, settings, tenant=tenant, run_id=run_id, decision_id=decision_id,
        approval_id=approval_id, tool=tool, args_hash=args_hash, policy=policy,
        approvers=approvers, now=now, ttl_s=ttl_s, actor=actor, break_glass=break_glass)
    await conn.execute(permits_table.insert(), row)
    return permit, event


# --- stored call input ---------------------------------------------------------------------


def call_input_row(*, tenant: str, decision_id: str, input_doc: dict[str, Any],
                   mask: tuple[str, ...]) -> dict[str, Any]:
    """The ``call_inputs`` row that keeps the policy input of a decided call (without
    ``now``) for redeem-time re-evaluation.

    Stored masked like the decision log (``mask`` paths of ``args`` plus always-secret keys
    anywhere, :mod:`cosigner.audit.masking`): redeem re-evaluates with the *presented* args
    (bound to the permit by hash), so the stored args are never needed in clear. Context
    values under always-secret keys are seen as ``"•••"`` by the redeem-time re-check.
    """
    kept = dict(input_doc)  # the members in their order, less "now"
    kept.pop("now", None)
    return {"decision_id": decision_id, "tenant": tenant,
            "input": mask_value(kept, ["/args" + pointer for pointer in mask] if mask else ()),
            "mask": list(mask)}


async def load_call_input(conn: AsyncConnection, tenant: str, decision_id: str
                          ) -> tuple[dict[str, Any], list[str]] | None:
    """``(input document without now, mask)`` of a decision, or ``None``."""
    row = (await conn.execute(_CALL_INPUT, {"decision_id": decision_id,
                                            "tenant": tenant})).first()
    return None if row is None else (dict(row.input), list(row.mask))


# --- withhold / revoke ---------------------------------------------------------------------


def _revoked_event(row: Any, actor: dict[str, Any], reason: str) -> Event:
    return Event(type="permit.revoked", actor=actor, decision_id=row.decision_id,
                 approval_id=row.approval_id, permit_jti=row.jti, run_id=row.run_id,
                 tool=row.tool, args_hash=row.args_hash, payload={"reason": reason})


async def withhold(conn: AsyncConnection, *, tenant: str, decision_id: str, now: datetime,
                   actor: dict[str, Any]) -> list[Event]:
    """Revoke a decision's unredeemed permits (a runtime asked for review).

    Raises:
        Conflict ``already_redeemed``: the call already ran; a review cannot stop it.
    """
    rows = (await conn.execute(select(permits_table).where(
        permits_table.c.tenant == tenant, permits_table.c.decision_id == decision_id,
        permits_table.c.approval_id.is_(None)))).all()
    events: list[Event] = []
    for row in rows:
        if row.status == "redeemed":
            raise Conflict("the decision's permit was already redeemed",
                           code="already_redeemed")
        if row.status == "issued" and await _mark_revoked(conn, row.jti, now):
            events.append(_revoked_event(row, actor, "review_requested"))
    return events


async def _mark_revoked(conn: AsyncConnection, jti: str, now: datetime) -> bool:
    result = await conn.execute(permits_table.update().where(
        permits_table.c.jti == jti, permits_table.c.status == "issued")
        .values(status="revoked", revoked_at=now))
    return bool(result.rowcount == 1)


async def revoke(deps: AppContext, caller: Caller, jti: str) -> dict[str, Any]:
    """Revoke an unredeemed permit of the caller's tenant (``admin`` or an approver).

    Revoking a revoked permit answers its state again (idempotent).

    Raises:
        Forbidden, NotFound, PermitRefused ``already_redeemed``.
    """
    if not (caller.has_any("admin") or caller.approver_roles()):
        raise Forbidden("revoking a permit needs the admin role or an approver role")
    now = deps.clock()
    async with deps.db.transaction() as conn:
        row = await permit_row(conn, caller.tenant, jti, lock=True)
        if row is None:
            raise NotFound("no such permit")
        if row.status == "redeemed":
            raise PermitRefused("the permit was already redeemed", code="already_redeemed")
        if row.status == "issued" and await _mark_revoked(conn, jti, now):
            await append(conn, caller.tenant,
                         [_revoked_event(row, caller.actor(), "revoked")], now=now)
    return {"jti": jti, "status": "revoked"}


PERMIT_ROW = select(permits_table).where(permits_table.c.jti == bindparam("jti"),
                                          permits_table.c.tenant == bindparam("tenant"))


PERMIT_ROW_FOR_UPDATE = PERMIT_ROW.with_for_update()


_CALL_INPUT = select(call_inputs.c.input, call_inputs.c.mask).where(
    call_inputs.c.decision_id == bindparam("decision_id"),
    call_inputs.c.tenant == bindparam("tenant"))


async def permit_row(conn: AsyncConnection, tenant: str, jti: str, *, lock: bool) -> Any:
    query = (PERMIT_ROW_FOR_UPDATE if lock and conn.dialect.name == "postgresql"
             else PERMIT_ROW)
    return (await conn.execute(query, {"jti": jti, "tenant": tenant})).first()
