"""Principals (stable subject ids in one tenant, with roles) and their API keys.

Built-in roles grant API access: ``runtime`` (decide, redeem, report), ``auditor``
(read the decision log), ``admin`` (policies, keys, principals), ``operator`` (system
operator: only in the system tenant ``_system``, the only role there; administers shared
policy bundles and reloads). Any other role name
(``finance``, ``security`` ...) makes the principal an approver for that role.

API keys look like ``csk_<key id>_<secret>``; only SHA-256 of the secret is stored
(the secret has 256 bits of entropy, so a slow hash adds nothing) and it is compared
with :func:`hmac.compare_digest`. Identity always comes from here, never from a body.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from server.audit.chain import Event, append
from server.clock import Clock
from server.db.database import Database
from server.db.tables import api_keys, principals
from server.errors import Forbidden, InvalidRequest, Unauthenticated

BUILTIN_ROLES = frozenset({"runtime", "auditor", "admin", "operator"})
#: server.audit.system.SYSTEM_TENANT (not imported: that module imports the policy store).
_SYSTEM_TENANT = "_system"
_ROLE_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_KEY_RE = re.compile(r"^csk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
#: How long a verified key stays cached in process (s): a disabled key may still work
#: this long on a replica that verified it just before.
KEY_CACHE_TTL_S = 10.0


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated identity of a request."""

    tenant: str
    principal_id: str
    subject: str
    roles: frozenset[str]
    kind: str  # "key" | "user"

    def has_any(self, *roles: str) -> bool:
        return not self.roles.isdisjoint(roles)

    def require(self, *roles: str) -> None:
        """Raise :class:`Forbidden` unless the caller holds one of ``roles``."""
        if not self.has_any(*roles):
            raise Forbidden(f"requires one of the roles: {', '.join(roles)}")

    def approver_roles(self) -> frozenset[str]:
        return self.roles - BUILTIN_ROLES


def is_approver_role(role: str) -> bool:
    """True when ``role`` is a role an approval requirement may name: a valid role name and
    not a built-in API role (``runtime``, ``auditor``, ``admin`` grant API access, never the
    right to approve; a requirement naming ``runtime`` would let agents approve agents)."""
    return bool(_ROLE_RE.match(role)) and role not in BUILTIN_ROLES


def validate_roles(roles: list[str]) -> list[str]:
    """Normalise and check role names; raises :class:`InvalidRequest`."""
    cleaned = sorted({r.strip() for r in roles})
    if not cleaned:
        raise InvalidRequest("at least one role is required", code="invalid_roles")
    for role in cleaned:
        if not _ROLE_RE.match(role):
            raise InvalidRequest(f"invalid role name: {role!r}", code="invalid_roles")
    return cleaned


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def get_or_create_principal(
    conn: AsyncConnection, *, tenant: str, subject: str, roles: list[str], kind: str,
    now: Any,
) -> tuple[str, bool]:
    """Return ``(principal_id, created)``; an existing principal gains the given roles."""
    row = (await conn.execute(
        select(principals.c.id, principals.c.roles).where(
            principals.c.tenant == tenant, principals.c.subject == subject)
    )).first()
    if row is not None:
        merged = sorted(set(row.roles) | set(roles))
        if merged != sorted(row.roles):
            await conn.execute(principals.update().where(principals.c.id == row.id)
                               .values(roles=merged))
        return row.id, False
    principal_id = str(uuid.uuid4())
    await conn.execute(principals.insert().values(
        id=principal_id, tenant=tenant, subject=subject, kind=kind, roles=sorted(roles),
        disabled=False, created_at=now))
    return principal_id, True


async def create_api_key(
    db: Database, *, tenant: str, roles: list[str], subject: str | None, clock: Clock,
) -> tuple[str, str]:
    """Create (or extend) a principal and give it a new API key.

    Returns ``(key, principal_id)``; the key string is shown once and never stored.
    Raises :class:`InvalidRequest` for bad tenant or role names.
    """
    if not _TENANT_RE.match(tenant) and tenant != _SYSTEM_TENANT:
        raise InvalidRequest("invalid tenant id", code="invalid_tenant")
    roles = validate_roles(roles)
    if (tenant == _SYSTEM_TENANT) != ("operator" in roles) or (
            tenant == _SYSTEM_TENANT and roles != ["operator"]):
        raise InvalidRequest("the role operator exists only in the tenant _system, and is "
                             "the only role there", code="invalid_roles")
    subject = subject or f"key-{secrets.token_hex(4)}"
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    now = clock()
    async with db.transaction() as conn:
        principal_id, created = await get_or_create_principal(
            conn, tenant=tenant, subject=subject, roles=roles, kind="key", now=now)
        await conn.execute(api_keys.insert().values(
            id=key_id, principal_id=principal_id, secret_hash=hash_secret(secret),
            created_at=now))
        # The key id is public (part of the key string); the secret never enters the log.
        await append(conn, tenant, [Event(
            type="principal.created" if created else "principal.updated",
            actor={"subject": "cli", "principal_id": None, "kind": "cli"}, principal=subject,
            payload={"principal_id": principal_id, "subject": subject, "kind": "key",
                     "roles": roles, "api_key_id": key_id})], now=now)
    return f"csk_{key_id}_{secret}", principal_id


class KeyAuthenticator:
    """Verify ``Authorization: Bearer csk_...`` keys, with a short in-process cache."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._cache: dict[str, tuple[float, str, Caller]] = {}

    async def authenticate(self, key: str) -> Caller:
        """Return the :class:`Caller` of an API key.

        Raises:
            Unauthenticated: malformed, unknown, revoked or disabled key.
        """
        match = _KEY_RE.match(key)
        if match is None:
            raise Unauthenticated("invalid API key")
        key_id, secret = match.groups()
        secret_hash = hash_secret(secret)
        cached = self._cache.get(key_id)
        if cached is not None and cached[0] > time.monotonic():
            if hmac.compare_digest(cached[1], secret_hash):
                return cached[2]
            raise Unauthenticated("invalid API key")
        async with self._db.read() as conn:
            row = (await conn.execute(
                select(api_keys.c.secret_hash, api_keys.c.revoked_at, principals.c.id,
                       principals.c.tenant, principals.c.subject, principals.c.roles,
                       principals.c.disabled, principals.c.kind)
                .join(principals, principals.c.id == api_keys.c.principal_id)
                .where(api_keys.c.id == key_id)
            )).first()
        if row is None or not hmac.compare_digest(row.secret_hash, secret_hash):
            raise Unauthenticated("invalid API key")
        if row.revoked_at is not None or row.disabled:
            raise Unauthenticated("API key revoked or principal disabled")
        caller = Caller(tenant=row.tenant, principal_id=row.id, subject=row.subject,
                        roles=frozenset(row.roles), kind="key")
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[key_id] = (time.monotonic() + KEY_CACHE_TTL_S, row.secret_hash, caller)
        return caller

    def forget(self) -> None:
        """Drop cached keys (after a principal is disabled in this process)."""
        self._cache.clear()
