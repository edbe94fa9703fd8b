"""Events about the server itself: policy bundles loaded/refused/activated, signing keys.

Policy bundles and the signing keyring are process-wide (one bundle may serve every tenant
via ``tenants = ["*"]``), so these events go to one chain of their own, the system tenant
:data:`SYSTEM_TENANT`. Its name cannot be a real tenant id (tenant ids start with a letter
or digit); its only principals are system operators (role ``operator``, API keys made
with ``cosigner principals add-key --tenant _system --role operator``), who administer
shared policy bundles; no role there reads the log over the API, so operators export it
with ``cosigner audit export --tenant _system``. Policy events (``policy.loaded``,
``policy.refused``, ``policy.activated``, ``policy.shadowed``, ``policy.admin_refused``)
are written by :mod:`cosigner.policy.admin`, here and in each affected tenant's chain.
Principal events belong to their tenant's chain (:mod:`cosigner.identity.principals`).

Recording is best effort where a failure must not stop the server from starting (the
caller logs it); policy and key changes also go to the error log.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select

from cosigner.audit.chain import Event, append
from cosigner.core.clock import isoformat
from cosigner.core.roles import SYSTEM_TENANT
from cosigner.db import event_row
from cosigner.db.database import Database
from cosigner.db.tables import audit_events
from cosigner.keys.keyring import Keyring

SYSTEM_ACTOR: dict[str, Any] = {"subject": "system", "principal_id": None, "kind": "system"}
#: Each event body, or a marker when it does not read (left out, logged).
_BODY = event_row.lenient(audit_events.c.body)


async def record_keyring(db: Database, keyring: Keyring, *, now: datetime) -> int:
    """Record ``key.created`` for every key of ``keyring`` not yet in the system chain.

    A ``key.created`` / ``key.rotated`` event that does not read back (rows deleted or
    damaged outside Cosigner) is left out, logged: its key is recorded again, so the log
    names every key in use at the cost of a repeated event, and the server still starts.
    """
    async with db.transaction() as conn:
        rows = (await conn.execute(select(audit_events.c.seq, _BODY).where(
            audit_events.c.tenant == SYSTEM_TENANT,
            audit_events.c.type.in_(("key.created", "key.rotated"))))).all()
        known: set[str] = set()
        for row in rows:
            body = event_row.readable(row.body, tenant=SYSTEM_TENANT, seq=int(row.seq),
                                      reader="the keyring record")
            if body is None:
                continue
            payload = body.get("payload", {})
            known.update(k for k in (payload.get("kid"), payload.get("new_kid")) if k)
        events = [Event(type="key.created", actor=SYSTEM_ACTOR,
                        payload={"kid": info.kid, "alg": "Ed25519",
                                 "created_at": isoformat(info.created_at),
                                 "retired_at": isoformat(info.retired_at)
                                 if info.retired_at else None})
                  for info in keyring.keys() if info.kid not in known]
        if events:
            await append(conn, SYSTEM_TENANT, events, now=now)
    return len(events)


async def record_key_rotated(db: Database, *, old_kid: str, new_kid: str, now: datetime,
                             actor: dict[str, Any] = SYSTEM_ACTOR) -> None:
    """Record ``key.rotated`` (``old_kid`` retired, ``new_kid`` signs from now on)."""
    async with db.transaction() as conn:
        await append(conn, SYSTEM_TENANT, [Event(
            type="key.rotated", actor=actor,
            payload={"old_kid": old_kid, "new_kid": new_kid, "kid": new_kid})], now=now)
