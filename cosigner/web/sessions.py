"""Server-side sign-in sessions.

The cookie holds an opaque 256-bit random id; the table holds only its SHA-256, so
reading the database does not let anyone sign in. A session ends after
``settings.session_idle_timeout_s`` without a request, ``settings.session_max_age_s``
after its sign-in however active (roles a single sign-on gave are then confirmed again at
the provider), at sign-out, or when the principal is disabled. A new id is issued at
every sign-in (no session fixation).

Each session records how its person authenticated (the caller's
:class:`~cosigner.identity.principals.Authn`: ``password``, or ``oidc`` with the ID token's
``acr``, ``amr`` and ``auth_time``); the caller a session loads carries it, so step-up
requirements (:mod:`cosigner.approvals.stepup`) are checked against the sign-in itself.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select

from cosigner.db.database import Database
from cosigner.db.tables import principals
from cosigner.db.tables_web import web_sessions
from cosigner.identity.principals import Authn, Caller

COOKIE = "cosigner_session"
#: Pre-sign-in cookie: the login form's CSRF token is bound to it.
PRE_COOKIE = "cosigner_presession"
#: Write ``last_seen_at`` at most this often (s), so page views rarely write.
TOUCH_EVERY_S = 30


def new_id() -> str:
    """A fresh opaque cookie value (256 bits)."""
    return secrets.token_urlsafe(32)


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


async def create(db: Database, caller: Caller, *, now: datetime,
                 idle_timeout_s: int | None = None) -> str:
    """Start a session for ``caller``; returns the raw id for the cookie.

    With ``idle_timeout_s``, the caller's sessions idle longer than that are deleted too
    (sessions nobody comes back to would otherwise stay in the table).
    """
    raw = new_id()
    async with db.transaction() as conn:
        if idle_timeout_s is not None:
            await conn.execute(delete(web_sessions).where(
                web_sessions.c.principal_id == caller.principal_id,
                web_sessions.c.last_seen_at < now - timedelta(seconds=idle_timeout_s)))
        await conn.execute(web_sessions.insert().values(
            id_hash=_hash(raw), principal_id=caller.principal_id, tenant=caller.tenant,
            created_at=now, last_seen_at=now, auth_method=caller.authn.method,
            acr=caller.authn.acr, amr=list(caller.authn.amr) or None,
            auth_time=caller.authn.auth_time))
    return raw


async def end(db: Database, raw: str) -> None:
    """Delete the session (sign-out, or the old session at a new sign-in)."""
    async with db.transaction() as conn:
        await conn.execute(delete(web_sessions).where(web_sessions.c.id_hash == _hash(raw)))


async def load(db: Database, raw: str, *, now: datetime, idle_timeout_s: int,
               max_age_s: int | None = None) -> Caller | None:
    """The caller of a live session, or ``None`` (unknown, idle too long, older than
    ``max_age_s`` since its sign-in, or disabled).

    An idle session is deleted; a live one has its ``last_seen_at`` moved to ``now``.
    """
    if not raw or len(raw) > 100:
        return None
    id_hash = _hash(raw)
    async with db.read() as conn:
        row = (await conn.execute(
            select(web_sessions.c.last_seen_at, web_sessions.c.created_at,
                   web_sessions.c.auth_method,
                   web_sessions.c.acr, web_sessions.c.amr, web_sessions.c.auth_time,
                   principals.c.id, principals.c.tenant,
                   principals.c.subject, principals.c.roles, principals.c.disabled)
            .join(principals, principals.c.id == web_sessions.c.principal_id)
            .where(web_sessions.c.id_hash == id_hash))).first()
    if row is None:
        return None
    idle = now - _aware(row.last_seen_at)
    too_old = max_age_s is not None and now - _aware(row.created_at) >= timedelta(
        seconds=max_age_s)
    if row.disabled or too_old or idle >= timedelta(seconds=idle_timeout_s):
        await end(db, raw)
        return None
    if idle >= timedelta(seconds=TOUCH_EVERY_S):
        async with db.transaction() as conn:
            await conn.execute(web_sessions.update().where(web_sessions.c.id_hash == id_hash)
                               .values(last_seen_at=now))
    return Caller(tenant=row.tenant, principal_id=row.id, subject=row.subject,
                  roles=frozenset(row.roles), kind="user",
                  authn=Authn(row.auth_method, acr=row.acr, amr=tuple(row.amr or ()),
                              auth_time=row.auth_time))
