"""Principals (stable subject ids in one tenant, with roles) and their API keys.

A principal's ``subject`` is stored in canonical form (:mod:`cosigner.core.subjects`), unique per
tenant, so one person is one principal however their id is spelt; ``display_name`` keeps
the spelling it was created with.

Built-in roles grant API access: ``runtime`` (decide, redeem, report), ``auditor``
(read the decision log), ``admin`` (policies, keys, principals). Any other role name
(``finance``, ``security`` ...) makes the principal an approver for that role.

API keys look like ``csk_<key id>_<secret>``; only SHA-256 of the secret is stored
(the secret has 256 bits of entropy, so a slow hash adds nothing) and it is compared
with :func:`hmac.compare_digest`. Identity always comes from here, never from a body.
"""

from __future__ import annotations

import asyncio
import functools
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

from cosigner.audit.chain import Event, append
from cosigner.core.clock import Clock
from cosigner.core.errors import Forbidden, InvalidRequest, SubjectConflict, Unauthenticated
from cosigner.core.roles import BUILTIN_ROLES, SYSTEM_TENANT, validate_roles
from cosigner.core.subjects import canonical_subject
from cosigner.db.database import Database
from cosigner.db.tables import api_keys, principals

#: ``\Z``, not ``$``: ``$`` also matches before a trailing newline (``"acme\n"``).
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
_KEY_RE = re.compile(r"^csk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})\Z")
#: How long a looked-up key id (known or not) stays cached in process (s). A disable is
#: followed sooner, through the credential generation (:meth:`KeyAuthenticator.observe`).
KEY_CACHE_TTL_S = 10.0
#: Key ids cached at most; past it unknown ids are dropped first (a flood of made-up ids
#: cannot evict the keys in use), then everything.
KEY_CACHE_MAX = 10_000


@dataclass(frozen=True, slots=True)
class Authn:
    """How a caller authenticated, for rules that ask more than "who" (step-up, signed
    reviews).

    ``method``: ``"api_key"``, ``"password"`` (a local account's web session), ``"oidc"``
    (a web session signed in through the tenant's OpenID provider) or ``"slack"`` (a
    linked Slack user's click). ``acr``/``amr``/``auth_time`` are the ID token's claims of
    the same names (OpenID Connect Core 1.0 §2; ``auth_time`` in seconds since the epoch),
    set only for ``"oidc"``.
    """

    method: str
    acr: str | None = None
    amr: tuple[str, ...] = ()
    auth_time: int | None = None

    def record(self) -> dict[str, Any]:
        """The ``authn`` object recorded in review events."""
        out: dict[str, Any] = {"method": self.method}
        if self.acr is not None:
            out["acr"] = self.acr
        if self.amr:
            out["amr"] = list(self.amr)
        if self.auth_time is not None:
            out["auth_time"] = self.auth_time
        return out


API_KEY_AUTHN = Authn("api_key")
PASSWORD_AUTHN = Authn("password")


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated identity of a request; ``authn`` says how it authenticated."""

    tenant: str
    principal_id: str
    subject: str
    roles: frozenset[str]
    kind: str  # "key" | "user"
    authn: Authn = API_KEY_AUTHN

    def has_any(self, *roles: str) -> bool:
        return not self.roles.isdisjoint(roles)

    def require(self, *roles: str) -> None:
        """Raise :class:`Forbidden` unless the caller holds one of ``roles``."""
        if not self.has_any(*roles):
            raise Forbidden(f"requires one of the roles: {', '.join(roles)}")

    def approver_roles(self) -> frozenset[str]:
        return self.roles - BUILTIN_ROLES

    def actor(self) -> dict[str, Any]:
        """The ``actor`` object recorded in decision-log events: who authenticated."""
        return {"subject": self.subject, "principal_id": self.principal_id, "kind": self.kind}


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


async def get_or_create_principal(
    conn: AsyncConnection, *, tenant: str, subject: str, display_name: str,
    roles: list[str], kind: str, now: Any,
) -> tuple[str, bool]:
    """Return ``(principal_id, created)``; an existing principal gains the given roles.

    ``subject`` must already be canonical (:func:`cosigner.core.subjects.canonical_subject`);
    ``display_name`` is the spelling it was given in. The principal is found by its
    canonical subject; one created with another spelling of it is another person claiming
    the same identity, so it is refused (the same spelling again is the same principal).

    Raises:
        SubjectConflict: ``subject_conflict`` — a principal of the tenant already has this
            subject in canonical form under another spelling.
    """
    row = (await conn.execute(
        select(principals.c.id, principals.c.roles, principals.c.display_name).where(
            principals.c.tenant == tenant, principals.c.subject == subject)
    )).first()
    if row is not None:
        if (row.display_name or subject) != display_name:
            raise SubjectConflict(
                f"{display_name!r} is the same subject as the existing principal "
                f"{row.display_name or subject!r} (compared as {subject!r}); use that "
                "spelling to change it", existing=row.display_name or subject)
        merged = sorted(set(row.roles) | set(roles))
        if merged != sorted(row.roles):
            await conn.execute(principals.update().where(principals.c.id == row.id)
                               .values(roles=merged))
        return row.id, False
    principal_id = str(uuid.uuid4())
    await conn.execute(principals.insert().values(
        id=principal_id, tenant=tenant, subject=subject, display_name=display_name,
        kind=kind, roles=sorted(roles), disabled=False, created_at=now))
    return principal_id, True


async def create_api_key(
    db: Database, *, tenant: str, roles: list[str], subject: str | None, clock: Clock,
) -> tuple[str, str]:
    """Create (or extend) a principal and give it a new API key.

    Returns ``(key, principal_id)``; the key string is shown once and never stored.

    Raises:
        InvalidRequest: bad tenant, role names or subject (``invalid_subject``).
        SubjectConflict: another spelling of ``subject`` is already a principal (409).
    """
    if not _TENANT_RE.match(tenant) and tenant != SYSTEM_TENANT:
        raise InvalidRequest("invalid tenant id", code="invalid_tenant")
    roles = validate_roles(roles)
    if (tenant == SYSTEM_TENANT) != ("operator" in roles) or (
            tenant == SYSTEM_TENANT and roles != ["operator"]):
        raise InvalidRequest("the role operator exists only in the tenant _system, and is "
                             "the only role there", code="invalid_roles")
    display_name = subject or f"key-{secrets.token_hex(4)}"
    canonical = canonical_subject(display_name)
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    now = clock()
    async with db.transaction() as conn:
        principal_id, created = await get_or_create_principal(
            conn, tenant=tenant, subject=canonical, display_name=display_name, roles=roles,
            kind="key", now=now)
        await conn.execute(api_keys.insert().values(
            id=key_id, principal_id=principal_id, secret_hash=hash_secret(secret),
            created_at=now))
        # The key id is public (part of the key string); the secret never enters the log.
        await append(conn, tenant, [Event(
            type="principal.created" if created else "principal.updated",
            actor={"subject": "cli", "principal_id": None, "kind": "cli"}, principal=canonical,
            payload={"principal_id": principal_id, "subject": canonical,
                     "display_name": display_name, "kind": "key", "roles": roles,
                     "api_key_id": key_id})], now=now)
    return f"csk_{key_id}_{secret}", principal_id


class KeyAuthenticator:
    """Verify ``Authorization: Bearer csk_...`` keys, with a short in-process cache.

    Known and unknown key ids cost the same (issue 13, fault 6): both are looked up in
    the database once and then answered from the cache for :data:`KEY_CACHE_TTL_S` — a
    known id with its caller, an unknown, revoked or disabled one as a negative entry —
    with the same SHA-256 and :func:`hmac.compare_digest` either way.

    The cache answers only while the credential generation is fresh
    (:meth:`observe`, fed by :class:`cosigner.db.replica_sync.ReplicaSync`): a disable
    committed by any process bumps it, which empties every replica's cache within one
    poll; an entry read before a bump is never stored after it. Without fresh
    observations (no poll loop, or the database unreachable) every check goes to the
    database.

    A key verified in full (regex, SHA-256, constant-time compare) is also remembered by
    its whole text next to its entry (``_verified``), so the next request with the same
    key costs one dict lookup and no allocation. That map holds presented keys for at most
    the entry's lifetime, is emptied with the cache (generation bump, :meth:`forget`) and
    is consulted only while the entry it points to is still the cached one and fresh.
    Lookups in it are by keyed string hash (SipHash), so its timing says nothing about
    how much of a guess matches.

    Single flight: concurrent lookups of one key id share one database read (a cold
    burst of N requests with one key makes one read, not N). A request joins only a read
    started under the current cache that has not sent its statement yet: a generation
    bump or :meth:`forget` makes later requests start their own, and so does a read's
    snapshot, so a request is never answered from a snapshot older than its arrival (a
    disable committed before it is seen, cache freshness aside).
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self._cache: dict[str, _CacheEntry] = {}
        #: Reads in flight by key id, for the current cache only (emptied with it).
        self._inflight: dict[str, asyncio.Task[_CacheEntry]] = {}
        self._verified: dict[str, tuple[str, _CacheEntry]] = {}  # key → (id, its entry)
        self._generation: int | None = None
        self._fresh_until = 0.0  # time.monotonic() after which the cache is not trusted

    def observe(self, generation: int, *, fresh_for_s: float) -> None:
        """Record the credential generation just read from the database; a new one empties
        the cache. The cache answers for ``fresh_for_s`` after this call."""
        if generation != self._generation:
            self._cache = {}
            self._verified = {}
            self._inflight = {}
            self._generation = generation
        self._fresh_until = time.monotonic() + fresh_for_s

    def cached(self, key: str) -> Caller | None:
        """The caller of ``key`` when the fresh cache knows it as valid, else ``None``
        (never touches the database; the rate-limit door uses it)."""
        now = time.monotonic()
        if now >= self._fresh_until:
            return None
        known = self._verified.get(key)
        if known is not None:
            key_id, entry = known
            if entry.expires > now and self._cache.get(key_id) is entry:
                return entry.caller
        match = _KEY_RE.match(key)
        if match is None:
            return None
        key_id, secret = match.groups()
        cached = self._cache.get(key_id)
        if cached is None or cached.expires <= now or cached.caller is None:
            return None
        if not hmac.compare_digest(cached.secret_hash, hash_secret(secret)):
            return None
        self._remember(key, key_id, cached)
        return cached.caller

    def _remember(self, key: str, key_id: str, entry: _CacheEntry) -> None:
        verified = self._verified
        if len(verified) > 10_000:
            verified.clear()
        verified[key] = (key_id, entry)

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
        now = time.monotonic()
        entry = self._cache.get(key_id) if now < self._fresh_until else None
        if entry is None or entry.expires <= now:
            entry = await self._lookup(key_id, now)
        # The same comparison whether the id is known or not.
        matches = hmac.compare_digest(entry.secret_hash, secret_hash)
        if entry.caller is None or not matches:
            raise Unauthenticated("API key revoked or principal disabled" if matches
                                  else "invalid API key")
        if self._cache.get(key_id) is entry and now < self._fresh_until:
            self._remember(key, key_id, entry)
        return entry.caller

    async def _lookup(self, key_id: str, now: float) -> _CacheEntry:
        """The entry of ``key_id`` from the database, sharing a read already in flight
        for it under the current cache (see the class docstring)."""
        inflight = self._inflight
        task = inflight.get(key_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._read(key_id, now))
            inflight[key_id] = task
            task.add_done_callback(functools.partial(_landed, inflight, key_id))
        # Shielded: one waiter cancelled (its client went away) does not cancel the others'.
        return await asyncio.shield(task)

    async def _read(self, key_id: str, now: float) -> _CacheEntry:
        generation, cache, inflight = self._generation, self._cache, self._inflight
        async with self._db.read() as conn:
            # From here on the read has its snapshot: a request arriving later starts its
            # own (one joined after, e.g. just after a revoke committed, would be answered
            # from a snapshot older than itself). A cold burst still joins: its requests
            # arrive before this read's first step.
            task = asyncio.current_task()
            if task is not None and inflight.get(key_id) is task:
                del inflight[key_id]
            row = (await conn.execute(
                select(api_keys.c.secret_hash, api_keys.c.revoked_at, principals.c.id,
                       principals.c.tenant, principals.c.subject, principals.c.roles,
                       principals.c.disabled, principals.c.kind)
                .join(principals, principals.c.id == api_keys.c.principal_id)
                .where(api_keys.c.id == key_id)
            )).first()
        expires = now + KEY_CACHE_TTL_S
        if row is None:
            entry = _CacheEntry(expires, _NO_SECRET, None)
        elif row.revoked_at is not None or row.disabled:
            entry = _CacheEntry(expires, row.secret_hash, None)
        else:
            entry = _CacheEntry(expires, row.secret_hash, Caller(
                tenant=row.tenant, principal_id=row.id, subject=row.subject,
                roles=frozenset(row.roles), kind="key"))
        # Not stored when a new generation was observed meanwhile: the row may predate it.
        if generation == self._generation and cache is self._cache:
            if len(cache) >= KEY_CACHE_MAX:
                _evict(cache)
            cache[key_id] = entry
        return entry

    def forget(self) -> None:
        """Drop cached keys and reads in flight (after a principal is disabled in this
        process)."""
        self._cache = {}
        self._verified = {}
        self._inflight = {}


def _landed(inflight: dict[str, asyncio.Task[_CacheEntry]], key_id: str,
            task: asyncio.Task[_CacheEntry]) -> None:
    """A read finished: later lookups start their own (or hit the cache it filled)."""
    if inflight.get(key_id) is task:
        del inflight[key_id]
    if not task.cancelled():
        task.exception()  # retrieved here too: every waiter may have gone


def _evict(cache: dict[str, _CacheEntry]) -> None:
    """Make room in a full cache: drop the negative entries (unknown, revoked, disabled),
    or everything when the known keys alone fill it."""
    for key_id in [k for k, entry in cache.items() if entry.caller is None]:
        del cache[key_id]
    if len(cache) >= KEY_CACHE_MAX // 2:
        cache.clear()


@dataclass(frozen=True, slots=True)
class _CacheEntry:
    expires: float  # time.monotonic()
    secret_hash: str
    caller: Caller | None  # None: unknown id, revoked key or disabled principal


#: Compared against when the id is unknown: no secret hashes to it (not hex).
_NO_SECRET = "-" * 64
