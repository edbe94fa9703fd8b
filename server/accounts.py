"""Approver accounts: create, disable, and check a password at sign-in.

Passwords are hashed with argon2id (``argon2-cffi`` defaults, RFC 9106). Sign-in takes the
same work whether or not the account exists: an unknown, disabled or password-less account
is checked against a dummy hash, and the error never says which of name or password was
wrong.

Failed sign-ins are counted in the database (table ``signin_failures``), so every replica
sees the same counts: per account (``ACCOUNT_LIMIT`` failures per window lock that name,
existing or not) and per client address (``ADDRESS_LIMIT``, against password spraying).
A locked key refuses without checking the password, for ``LOCKOUT_S`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from sqlalchemy import delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from server.audit.chain import Event, append
from server.clock import Clock
from server.db.database import Database
from server.db.tables import api_keys, principals
from server.db.tables_web import signin_failures, web_sessions
from server.errors import InvalidRequest, NotFound, Unauthenticated
from server.principals import _TENANT_RE, Caller, get_or_create_principal, validate_roles

log = logging.getLogger("cosigner.accounts")

MIN_PASSWORD_LENGTH = 12
MAX_PASSWORD_LENGTH = 1024
WINDOW_S = 15 * 60
LOCKOUT_S = 15 * 60
ACCOUNT_LIMIT = 5
ADDRESS_LIMIT = 50
_NAME_MAX = 256


@dataclass(frozen=True, slots=True)
class SigninLimits:
    """Failure limits (tests shrink them)."""

    account: int = ACCOUNT_LIMIT
    address: int = ADDRESS_LIMIT
    window_s: int = WINDOW_S
    lockout_s: int = LOCKOUT_S


@lru_cache(maxsize=1)
def _hasher() -> PasswordHasher:
    return PasswordHasher()


@lru_cache(maxsize=1)
def _dummy_hash() -> str:
    """A real argon2 hash of a random value, so unknown accounts cost the same to check."""
    import secrets

    return _hasher().hash(secrets.token_urlsafe(24))


def hash_password(password: str) -> str:
    """argon2id hash of ``password``; raises :class:`InvalidRequest` if it is too short."""
    if not MIN_PASSWORD_LENGTH <= len(password) <= MAX_PASSWORD_LENGTH:
        raise InvalidRequest(f"password must be {MIN_PASSWORD_LENGTH} to "
                             f"{MAX_PASSWORD_LENGTH} characters", code="weak_password")
    return _hasher().hash(password)


def _verify(stored: str | None, password: str) -> bool:
    try:
        return _hasher().verify(stored or _dummy_hash(), password) and stored is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def _check_name(tenant: str, name: str, *, system: bool = False) -> None:
    """``system``: the system tenant ``_system`` is allowed too (its operators can be
    disabled; they are API keys only, never users)."""
    if not _TENANT_RE.match(tenant) and not (system and tenant == "_system"):
        raise InvalidRequest("invalid tenant id", code="invalid_tenant")
    if not name.strip() or len(name) > _NAME_MAX or name != name.strip():
        raise InvalidRequest("invalid user name", code="invalid_name")


def _actor(subject: str) -> dict[str, Any]:
    return {"subject": subject, "principal_id": None, "kind": "cli"}


async def add_user(db: Database, *, tenant: str, name: str, roles: list[str], password: str,
                   clock: Clock, actor: str = "cli") -> str:
    """Create the approver ``name`` in ``tenant`` (or give an existing subject a password
    and these roles, and enable it again). Returns the principal id.

    Raises:
        InvalidRequest: bad tenant, name, role names, or a password under 12 characters.
    """
    _check_name(tenant, name)
    roles = validate_roles(roles)
    password_hash = await asyncio.to_thread(hash_password, password)
    now = clock()
    async with db.transaction() as conn:
        principal_id, created = await get_or_create_principal(
            conn, tenant=tenant, subject=name, roles=roles, kind="user", now=now)
        await conn.execute(principals.update().where(principals.c.id == principal_id)
                           .values(password_hash=password_hash, disabled=False))
        await append(conn, tenant, [Event(
            type="principal.created" if created else "principal.updated",
            actor=_actor(actor), principal=name,
            payload={"principal_id": principal_id, "subject": name, "kind": "user",
                     "roles": roles, "password_set": True})], now=now)
    return principal_id


async def disable_principal(db: Database, *, tenant: str, name: str, clock: Clock,
                            actor: str = "cli") -> dict[str, int]:
    """Disable a principal: it can no longer sign in, its sessions end and its API keys
    are revoked. Returns ``{"sessions": n, "api_keys": m}`` (how many ended).

    Replicas that cached one of its API keys may accept it for up to
    :data:`server.principals.KEY_CACHE_TTL_S` more seconds.

    Raises:
        NotFound: no such principal in the tenant.
    """
    _check_name(tenant, name, system=True)
    now = clock()
    async with db.transaction() as conn:
        row = (await conn.execute(select(principals.c.id).where(
            principals.c.tenant == tenant, principals.c.subject == name))).first()
        if row is None:
            raise NotFound(f"no principal {name!r} in tenant {tenant!r}")
        await conn.execute(principals.update().where(principals.c.id == row.id)
                           .values(disabled=True))
        sessions = (await conn.execute(delete(web_sessions).where(
            web_sessions.c.principal_id == row.id))).rowcount
        keys = (await conn.execute(update(api_keys).where(
            api_keys.c.principal_id == row.id, api_keys.c.revoked_at.is_(None))
            .values(revoked_at=now))).rowcount
        await append(conn, tenant, [Event(
            type="principal.disabled", actor=_actor(actor), principal=name,
            payload={"principal_id": row.id, "subject": name, "sessions_ended": sessions,
                     "api_keys_revoked": keys})], now=now)
    return {"sessions": int(sessions or 0), "api_keys": int(keys or 0)}


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)  # SQLite returns naive UTC
    return value


def _keys(tenant: str, name: str, address: str) -> tuple[str, str]:
    return f"account:{tenant}/{name[:_NAME_MAX]}", f"address:{address[:200]}"


async def _locked(conn: AsyncConnection, keys: tuple[str, ...], now: datetime) -> bool:
    rows = (await conn.execute(select(signin_failures.c.locked_until).where(
        signin_failures.c.key.in_(keys)))).all()
    return any((_aware(r.locked_until) or now) > now for r in rows)


async def _count_failure(conn: AsyncConnection, key: str, limit: int, limits: SigninLimits,
                         now: datetime) -> None:
    insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    await conn.execute(insert(signin_failures).values(
        key=key, failures=0, window_start=now, locked_until=None)
        .on_conflict_do_nothing(index_elements=["key"]))
    query = select(signin_failures).where(signin_failures.c.key == key)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    row = (await conn.execute(query)).one()
    window_start = _aware(row.window_start) or now
    failures = row.failures + 1
    if now - window_start >= timedelta(seconds=limits.window_s):
        window_start, failures = now, 1
    locked_until = now + timedelta(seconds=limits.lockout_s) if failures >= limit else None
    await conn.execute(signin_failures.update().where(signin_failures.c.key == key).values(
        failures=0 if locked_until else failures, window_start=window_start,
        locked_until=locked_until or _aware(row.locked_until)))


async def authenticate_password(db: Database, *, tenant: str, name: str, password: str,
                                address: str, clock: Clock,
                                limits: SigninLimits | None = None) -> Caller:
    """The :class:`Caller` of a correct tenant/name/password.

    Raises:
        Unauthenticated: ``invalid_credentials`` (wrong name or password, unknown tenant,
            disabled account: one message for all) or ``signin_throttled`` (too many
            failures for this account or address; try again later).
    """
    limits = limits or SigninLimits()
    now = clock()
    account_key, address_key = _keys(tenant, name, address)
    async with db.read() as conn:
        if await _locked(conn, (account_key, address_key), now):
            raise Unauthenticated("too many failed sign-ins; try again later",
                                  code="signin_throttled")
        row = (await conn.execute(select(
            principals.c.id, principals.c.subject, principals.c.roles,
            principals.c.password_hash, principals.c.disabled).where(
            principals.c.tenant == tenant, principals.c.subject == name))).first()
    stored = row.password_hash if row is not None and not row.disabled else None
    ok = await asyncio.to_thread(_verify, stored, password[:MAX_PASSWORD_LENGTH])
    if not ok or row is None:
        async with db.transaction() as conn:
            await _count_failure(conn, account_key, limits.account, limits, now)
            await _count_failure(conn, address_key, limits.address, limits, now)
        log.info("failed sign-in for tenant %s from %s", tenant, address)
        raise Unauthenticated("wrong name or password", code="invalid_credentials")
    async with db.transaction() as conn:
        await conn.execute(delete(signin_failures).where(signin_failures.c.key == account_key))
    return Caller(tenant=tenant, principal_id=row.id, subject=row.subject,
                  roles=frozenset(row.roles), kind="user")
