"""Approver accounts: create, disable, and check a password at sign-in.

Passwords are hashed with argon2id (``argon2-cffi`` defaults, RFC 9106). Sign-in takes the
same work whether or not the account exists: an unknown, disabled or password-less account
is checked against a dummy hash, and the error never says which of name or password was
wrong.

Sign-in limits (:class:`SigninLimits`, from settings) are kept in the database (table
``signin_failures``), so every replica sees the same counts. Two keys, counted apart:

* **the account name** (``account:<tenant>/<name>``, NFKC + case fold; existing or not):
  from the ``account``-th failure within the window, the name is locked for ``backoff_s``,
  doubling with each further failure up to ``lockout_s``. It applies from every address:
  a correct password for a locked name still fails until the lock ends.
* **the client address** (``address:<ip>``, the real peer or, behind a trusted proxy, the
  address the proxy saw; :mod:`cosigner.http.proxies`): ``address`` failures within the window
  lock every name from that address for ``lockout_s`` (password spraying). A failure on a
  name already at its own limit does not count here, so a flood on one name never locks
  its address for the others there; a locked address never locks a name tried elsewhere.

A locked key refuses without checking the password and without counting. A key's count
is forgotten once ``window_s`` passed since its window began *and* since its last lock
ended, so trying again right after a lock ends extends it. A correct password clears the
name's count (never the address's).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.audit.chain import Event, append
from cosigner.core.clock import Clock
from cosigner.core.errors import InvalidRequest, NotFound, Unauthenticated
from cosigner.core.roles import SYSTEM_TENANT, validate_roles
from cosigner.core.subjects import canonical_subject, subject_key
from cosigner.db import generations
from cosigner.db.database import Database, dialect_insert
from cosigner.db.tables import api_keys, principals
from cosigner.db.tables_web import signin_failures, web_sessions
from cosigner.identity.principals import (
    _TENANT_RE,
    PASSWORD_AUTHN,
    Caller,
    get_or_create_principal,
)

log = logging.getLogger("cosigner.accounts")

MIN_PASSWORD_LENGTH = 12
MAX_PASSWORD_LENGTH = 1024
WINDOW_S = 15 * 60
LOCKOUT_S = 15 * 60
BACKOFF_S = 30
ACCOUNT_LIMIT = 5
ADDRESS_LIMIT = 50
_NAME_MAX = 256


@dataclass(frozen=True, slots=True)
class SigninLimits:
    """Failure limits (see the module docstring); ``settings.signin_*`` in the server."""

    account: int = ACCOUNT_LIMIT
    address: int = ADDRESS_LIMIT
    window_s: int = WINDOW_S
    lockout_s: int = LOCKOUT_S
    backoff_s: int = BACKOFF_S

    def account_lock_s(self, failures: int) -> int:
        """Lock of a name after its ``failures``-th failure (0: not locked)."""
        if failures < self.account:
            return 0
        return int(min(self.backoff_s * 2 ** min(failures - self.account, 32), self.lockout_s))

    def address_lock_s(self, failures: int) -> int:
        """Lock of an address after its ``failures``-th failure (0: not locked)."""
        return self.lockout_s if failures >= self.address else 0


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


def _check_name(tenant: str, name: str, *, system: bool = False) -> str:
    """The canonical subject of ``name`` (:func:`cosigner.core.subjects.canonical_subject`).
    ``system``: the system tenant ``_system`` is allowed too (its operators can be
    disabled; they are API keys only, never users)."""
    if not _TENANT_RE.match(tenant) and not (system and tenant == SYSTEM_TENANT):
        raise InvalidRequest("invalid tenant id", code="invalid_tenant")
    return canonical_subject(name)


def _actor(subject: str) -> dict[str, Any]:
    return {"subject": subject, "principal_id": None, "kind": "cli"}


async def add_user(db: Database, *, tenant: str, name: str, roles: list[str], password: str,
                   clock: Clock, actor: str = "cli") -> str:
    """Create the approver ``name`` in ``tenant`` (or give an existing subject a password
    and these roles, and enable it again). Returns the principal id.

    ``name`` is stored in canonical form (``Alice@Corp.Example`` is ``alice@corp.example``),
    its spelling as the display name.

    Raises:
        InvalidRequest: bad tenant, name (``invalid_subject``; also a name starting with
            ``oidc:``, reserved for single sign-on subjects), role names, or a password
            under 12 characters.
        SubjectConflict: another spelling of ``name`` is already a principal (409).
    """
    subject = _check_name(tenant, name)
    if subject.startswith("oidc:"):  # single sign-on subjects never get a password
        raise InvalidRequest("names starting with 'oidc:' are single sign-on subjects",
                             code="invalid_subject")
    roles = validate_roles(roles)
    password_hash = await asyncio.to_thread(hash_password, password)
    now = clock()
    async with db.transaction() as conn:
        principal_id, created = await get_or_create_principal(
            conn, tenant=tenant, subject=subject, display_name=name, roles=roles,
            kind="user", now=now)
        await conn.execute(principals.update().where(principals.c.id == principal_id)
                           .values(password_hash=password_hash, disabled=False))
        await append(conn, tenant, [Event(
            type="principal.created" if created else "principal.updated",
            actor=_actor(actor), principal=subject,
            payload={"principal_id": principal_id, "subject": subject, "display_name": name,
                     "kind": "user", "roles": roles, "password_set": True})], now=now)
    return principal_id


async def disable_principal(db: Database, *, tenant: str, name: str, clock: Clock,
                            actor: str = "cli") -> dict[str, int]:
    """Disable a principal: it can no longer sign in, its sessions end and its API keys
    are revoked. Returns ``{"sessions": n, "api_keys": m}`` (how many ended).

    The credential generation is bumped in the same transaction, so every replica drops
    its cached API keys within ``replica_poll_s`` (:mod:`cosigner.db.replica_sync`).

    ``name`` in any spelling of the principal's subject.

    Raises:
        NotFound: no such principal in the tenant.
    """
    subject = _check_name(tenant, name, system=True)
    now = clock()
    async with db.transaction() as conn:
        row = (await conn.execute(select(principals.c.id).where(
            principals.c.tenant == tenant, principals.c.subject == subject))).first()
        if row is None:
            raise NotFound(f"no principal {name!r} in tenant {tenant!r}")
        await conn.execute(principals.update().where(principals.c.id == row.id)
                           .values(disabled=True))
        sessions = (await conn.execute(delete(web_sessions).where(
            web_sessions.c.principal_id == row.id))).rowcount
        keys = (await conn.execute(update(api_keys).where(
            api_keys.c.principal_id == row.id, api_keys.c.revoked_at.is_(None))
            .values(revoked_at=now))).rowcount
        await generations.bump(conn, generations.CREDENTIALS)
        await append(conn, tenant, [Event(
            type="principal.disabled", actor=_actor(actor), principal=subject,
            payload={"principal_id": row.id, "subject": subject, "sessions_ended": sessions,
                     "api_keys_revoked": keys})], now=now)
    return {"sessions": int(sessions or 0), "api_keys": int(keys or 0)}


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)  # SQLite returns naive UTC
    return value


def _keys(tenant: str, name: str, address: str) -> tuple[str, str]:
    # One name in any spelling is one key (canonical subject), so variants share a lock.
    return f"account:{tenant}/{subject_key(name[:_NAME_MAX])}", f"address:{address[:200]}"


async def _locked(conn: AsyncConnection, keys: tuple[str, ...], now: datetime) -> bool:
    rows = (await conn.execute(select(signin_failures.c.locked_until).where(
        signin_failures.c.key.in_(keys)))).all()
    return any((_aware(r.locked_until) or now) > now for r in rows)


async def _count_failure(conn: AsyncConnection, key: str, lock_s: Callable[[int], int],
                         limits: SigninLimits, now: datetime) -> int:
    """Count one failure of ``key`` (row-locked on PostgreSQL); returns the count before it."""
    insert = dialect_insert(conn.dialect.name)
    await conn.execute(insert(signin_failures).values(
        key=key, failures=0, window_start=now, locked_until=None)
        .on_conflict_do_nothing(index_elements=["key"]))
    query = select(signin_failures).where(signin_failures.c.key == key)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    row = (await conn.execute(query)).one()
    window_start = _aware(row.window_start) or now
    last_lock_end = _aware(row.locked_until) or window_start
    before = row.failures
    if now - max(window_start, last_lock_end) >= timedelta(seconds=limits.window_s):
        window_start, before = now, 0
    seconds = lock_s(before + 1)
    await conn.execute(signin_failures.update().where(signin_failures.c.key == key).values(
        failures=before + 1, window_start=window_start,
        locked_until=now + timedelta(seconds=seconds) if seconds else row.locked_until))
    return int(before)


async def authenticate_password(db: Database, *, tenant: str, name: str, password: str,
                                address: str, clock: Clock,
                                limits: SigninLimits | None = None) -> Caller:
    """The :class:`Caller` of a correct tenant/name/password; records the sign-in in
    ``principals.last_signed_in_at`` (the freshness a Slack click needs).

    Raises:
        Unauthenticated: ``invalid_credentials`` (wrong name or password, unknown tenant,
            disabled account: one message for all) or ``signin_throttled`` (too many
            failures for this account or address; try again later).
    """
    limits = limits or SigninLimits()
    now = clock()
    # One account however it is spelt: looked up, and its failures counted, canonically.
    name = subject_key(name[:_NAME_MAX])
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
            before = await _count_failure(conn, account_key, limits.account_lock_s, limits,
                                          now)
            if before < limits.account:  # a name past its limit stops feeding the address
                await _count_failure(conn, address_key, limits.address_lock_s, limits, now)
        log.info("failed sign-in for tenant %s from %s", tenant, address)
        raise Unauthenticated("wrong name or password", code="invalid_credentials")
    async with db.transaction() as conn:
        await conn.execute(delete(signin_failures).where(signin_failures.c.key == account_key))
        await conn.execute(update(principals).where(principals.c.id == row.id)
                           .values(last_signed_in_at=now))
    return Caller(tenant=tenant, principal_id=row.id, subject=row.subject,
                  roles=frozenset(row.roles), kind="user", authn=PASSWORD_AUTHN)
