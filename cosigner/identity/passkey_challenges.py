"""WebAuthn challenges, stored server-side: single use, short-lived, replica-safe.

A challenge row names the person it was issued to (tenant, principal, subject), its purpose
(``register`` or ``review``) and, for a signed review, the approval, the decision and the
review statement whose digest *is* the challenge (:mod:`cosigner.core.review_statements`).
:func:`take` uses one up with a conditional ``UPDATE ... WHERE used_at IS NULL``, so of two
replicas finishing the same ceremony at most one succeeds.
"""

from __future__ import annotations

import json
import secrets
import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.core.review_statements import b64url, from_b64url
from cosigner.db.tables_passkeys import webauthn_challenges
from cosigner.identity.principals import Caller

#: How long a challenge may be answered (s); the browser's ``timeout`` is the same.
TTL_S = 120
#: Expired challenges older than this are deleted when new ones are issued (s).
KEEP_S = 3600


async def issue(conn: AsyncConnection, caller: Caller, *, purpose: str, now: datetime,
                challenge: bytes | None = None, approval_id: str | None = None,
                decision: str | None = None, statement: dict[str, Any] | None = None
                ) -> bytes:
    """Store a challenge for ``caller`` (32 random bytes unless given); returns its bytes."""
    value = challenge if challenge is not None else secrets.token_bytes(32)
    await conn.execute(delete(webauthn_challenges).where(
        webauthn_challenges.c.expires_at < now - timedelta(seconds=KEEP_S)))
    await conn.execute(webauthn_challenges.insert().values(
        id=str(uuid.uuid4()), tenant=caller.tenant, principal_id=caller.principal_id,
        subject=caller.subject, purpose=purpose, challenge=b64url(value),
        approval_id=approval_id, decision=decision, statement=statement, created_at=now,
        expires_at=now + timedelta(seconds=TTL_S)))
    return value


async def find(conn: AsyncConnection, caller: Caller, *, purpose: str,
               challenge: bytes) -> Any:
    """The caller's challenge row with these bytes (used or not), or ``None``."""
    return (await conn.execute(select(webauthn_challenges).where(
        webauthn_challenges.c.tenant == caller.tenant,
        webauthn_challenges.c.challenge == b64url(challenge),
        webauthn_challenges.c.subject == caller.subject,
        webauthn_challenges.c.purpose == purpose))).first()


async def take(conn: AsyncConnection, caller: Caller, *, purpose: str,
               challenge: bytes | None, now: datetime) -> Any:
    """Use up the caller's unexpired, unused challenge; its row, or ``None``."""
    if challenge is None:
        return None
    row = await find(conn, caller, purpose=purpose, challenge=challenge)
    if row is None or row.used_at is not None or now >= _aware(row.expires_at):
        return None
    done = await conn.execute(webauthn_challenges.update().where(
        webauthn_challenges.c.id == row.id, webauthn_challenges.c.used_at.is_(None))
        .values(used_at=now))
    return row if done.rowcount == 1 else None


def _aware(moment: datetime) -> datetime:
    from datetime import UTC

    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def is_open(row: Any, now: datetime) -> bool:
    """Unused and unexpired."""
    return bool(row.used_at is None and now < _aware(row.expires_at))


def client_challenge(credential: Any, kind: str) -> bytes | None:
    """The challenge named by a browser credential's client data of type ``kind``
    (``webauthn.create``/``webauthn.get``), or ``None`` when unreadable."""
    try:
        if isinstance(credential, str):
            credential = json.loads(credential)
        data = json.loads(from_b64url(credential["response"]["clientDataJSON"]))
        if data.get("type") != kind:
            return None
        return from_b64url(data["challenge"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
