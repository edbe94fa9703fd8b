"""Read a permit's state, so a client that lost a redeem response can ask before retrying.

A redeem whose response was lost may or may not have consumed the permit. Retrying it
blindly would either fail (``already_redeemed``, and the caller would not know whether it
was its own redeem) or, in a naive client, run the side effect twice. The client asks
here instead: ``issued`` → the redeem did not happen, retry it; ``redeemed`` and
``redeemed_by_you`` → the lost redeem was the caller's own, execute once; anything else →
do not execute.

``redeemed_by_you`` rests on the ``permit.redeemed`` event's actor. When that event is in
the log but does not read back (rows deleted or damaged outside Cosigner:
:class:`~cosigner.db.event_row.EventUnreadable`), the answer fails closed: a 500
``audit_event_unreadable`` problem, never ``redeemed_by_you: false`` (which would silently
tell the real redeemer that someone else consumed its permit) nor a guess.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from cosigner.core.clock import isoformat
from cosigner.core.errors import NotFound
from cosigner.db import event_row
from cosigner.db.database import Database
from cosigner.db.tables import audit_events, permits
from cosigner.identity.principals import Caller

#: Decision-log event types that record a successful redeem (issue 4's permit ledger).
REDEEM_EVENTS = ("permit.redeemed",)
#: The event body, an :class:`~cosigner.db.event_row.Unreadable` marker when it does not
#: read (then :func:`~cosigner.db.event_row.document` raises, with the event's seq).
_BODY = event_row.lenient(audit_events.c.body)


def _utc(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)  # SQLite returns naive UTC
    return value


def _iso(value: datetime | None) -> str | None:
    return isoformat(value) if value is not None else None


async def permit_status(db: Database, caller: Caller, jti: str, *,
                        now: datetime) -> dict[str, Any]:
    """The PermitState v1 object of permit ``jti`` in the caller's tenant.

    ``status`` is ``issued | redeemed | revoked | expired`` (an issued permit at
    ``now >= expires_at`` reads as ``expired``, RFC 7519 §4.1.4). ``redeemed_by_you`` is
    true when the redeem was made by the calling principal's subject.
    Raises :class:`NotFound` (404) for an unknown jti or one of another tenant, and
    :class:`~cosigner.db.event_row.EventUnreadable` (500 ``audit_event_unreadable``) for a
    redeemed permit whose redeem event does not read back or does not hash to its row's
    hash (module docstring).
    """
    async with db.read() as conn:
        row = (await conn.execute(select(permits).where(
            permits.c.tenant == caller.tenant, permits.c.jti == jti))).first()
        if row is None:
            raise NotFound("no such permit in this tenant")
        redeemer: str | None = None
        if row.status == "redeemed":
            event = (await conn.execute(
                select(audit_events.c.seq, _BODY, audit_events.c.hash).where(
                    audit_events.c.tenant == caller.tenant, audit_events.c.permit_jti == jti,
                    audit_events.c.type.in_(REDEEM_EVENTS))
                .order_by(audit_events.c.seq).limit(1))).first()
            if event is not None:  # none: pruned by retention (redeemed_by_you false)
                body = event_row.document(event.body, tenant=caller.tenant,
                                          seq=int(event.seq), digest=event.hash)
                redeemer = (body.get("actor") or {}).get("subject")
    expires_at = _utc(row.expires_at)
    status = row.status
    if status == "issued" and expires_at is not None and now >= expires_at:
        status = "expired"
    return {
        "jti": row.jti, "status": status, "tool": row.tool, "args_hash": row.args_hash,
        "run_id": row.run_id, "decision_id": row.decision_id,
        "approval_id": row.approval_id, "expires_at": _iso(expires_at),
        "redeemed_at": _iso(_utc(row.redeemed_at)),
        "redeemed_by_you": redeemer is not None and redeemer == caller.subject,
    }
