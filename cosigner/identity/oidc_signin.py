"""Single sign-on state and principals: pending sign-ins, and who an ID token makes.

A sign-in starts with :func:`begin`, which stores SHA-256 of a fresh ``state`` with the
``nonce``, the PKCE code verifier, the tenant, SHA-256 of a browser-binding secret (a
cookie of the browser that started it) and the client address in ``oidc_logins`` (an
address may have ``settings.oidc_pending_per_address_max`` unfinished ones at most).
:func:`consume` deletes that row as it reads it, so a ``state`` works once, on any
replica, and only in the browser that started it, before ``settings.oidc_login_ttl_s`` ends.

:func:`sign_in` turns a checked ID token into a :class:`Caller`. The subject is
``oidc:<issuer>#<sub>`` — the provider's ``sub`` scoped by its issuer, never an e-mail
the person can change — stored canonically (:mod:`cosigner.core.subjects`); since ``sub``
is case-sensitive and the canonical form is not, the exact spelling is kept as the display
name and another spelling of the same canonical subject is refused
(``oidc_subject_conflict``) rather than merged. The principal's roles are replaced by the
roles ``role_map`` gives the token's ``roles_claim`` at every sign-in; a token giving none
is refused (``oidc_no_role``), and an existing principal then loses its roles and
sessions. Events, in the tenant's chain: ``principal.created`` / ``principal.updated``
(roles changed), ``web.signed_in`` (with ``authn``) and ``web.signin_refused``
(:func:`record_refusal`). A sign-in sets ``principals.last_signed_in_at`` (the freshness
a Slack click needs, :mod:`cosigner.slack.links`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select

from cosigner.audit.chain import Event, append
from cosigner.core.clock import Clock
from cosigner.core.errors import InvalidRequest, SignInRefused, SubjectConflict
from cosigner.core.settings import OidcProvider
from cosigner.core.subjects import canonical_subject
from cosigner.db.database import Database
from cosigner.db.tables import principals
from cosigner.db.tables_web import oidc_logins, web_sessions
from cosigner.identity.oidc import IdToken
from cosigner.identity.principals import Authn, Caller, get_or_create_principal

SUBJECT_PREFIX = "oidc:"
_MAX_CLAIM_VALUES = 20


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def subject_for(issuer: str, sub: str) -> str:
    """The subject of ``sub`` at ``issuer``, as spelt (``oidc:<issuer>#<sub>``)."""
    return f"{SUBJECT_PREFIX}{issuer}#{sub}"


@dataclass(frozen=True, slots=True)
class Pending:
    """A started sign-in, as :func:`consume` hands it back."""

    tenant: str
    nonce: str
    code_verifier: str
    next_path: str
    step_up: dict[str, Any] | None


def address_key(address: str) -> str:
    """The key unfinished sign-ins are counted under: the IP address, an IPv6 address by
    its /64 (one host usually holds a whole /64); anything else as given, cut to 64."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


async def begin(db: Database, *, tenant: str, browser_secret: str, next_path: str,
                step_up: dict[str, Any] | None, now: datetime, ttl_s: int,
                address: str, max_pending: int) -> tuple[str, Pending]:
    """Store a new pending sign-in; returns ``(state, pending)``. Expired rows go too.

    ``address``: the client address that asks; it may have at most ``max_pending``
    unfinished sign-ins within their lifetime (anyone may start one, so the table
    must not grow without bound).

    Raises:
        SignInRefused: ``oidc_too_many_pending``, with ``extra["retry_after_s"]`` (s until
            the address's oldest unfinished sign-in expires).
    """
    state = secrets.token_urlsafe(32)
    pending = Pending(tenant=tenant, nonce=secrets.token_urlsafe(32),
                      code_verifier=secrets.token_urlsafe(48), next_path=next_path,
                      step_up=step_up)
    key = address_key(address)
    async with db.transaction() as conn:
        await conn.execute(delete(oidc_logins).where(oidc_logins.c.expires_at < now))
        count, oldest = (await conn.execute(
            select(func.count(), func.min(oidc_logins.c.expires_at)).where(
                oidc_logins.c.address == key, oidc_logins.c.expires_at >= now))).one()
        if count >= max_pending:
            wait = (oldest if oldest.tzinfo else oldest.replace(tzinfo=now.tzinfo)) - now
            raise SignInRefused("too many unfinished sign-ins from this address",
                                code="oidc_too_many_pending",
                                retry_after_s=max(int(wait.total_seconds()), 1))
        await conn.execute(oidc_logins.insert().values(
            state_hash=_hash(state), browser_hash=_hash(browser_secret), tenant=tenant,
            nonce=pending.nonce, code_verifier=pending.code_verifier, next_path=next_path,
            step_up=step_up, created_at=now, expires_at=now + timedelta(seconds=ttl_s),
            address=key))
    return state, pending


async def consume(db: Database, *, state: str, browser_secret: str | None,
                  now: datetime) -> Pending:
    """The pending sign-in of ``state``, deleted in the same transaction (single use).

    Raises:
        SignInRefused: ``oidc_state_invalid`` (unknown or already used state, or another
            browser's) or ``oidc_state_expired``.
    """
    if not state or len(state) > 200:
        raise SignInRefused("no such sign-in", code="oidc_state_invalid")
    key = _hash(state)
    async with db.transaction() as conn:
        row = (await conn.execute(select(oidc_logins).where(
            oidc_logins.c.state_hash == key))).first()
        taken = (await conn.execute(delete(oidc_logins).where(
            oidc_logins.c.state_hash == key))).rowcount if row is not None else 0
    if row is None or taken != 1:
        raise SignInRefused("this sign-in was already used or never started here",
                            code="oidc_state_invalid")
    if not browser_secret or not hmac.compare_digest(row.browser_hash,
                                                     _hash(browser_secret)):
        raise SignInRefused("this sign-in was started in another browser",
                            code="oidc_state_invalid")
    expires = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(
        tzinfo=now.tzinfo)
    if now >= expires:
        raise SignInRefused("this sign-in took too long", code="oidc_state_expired")
    return Pending(tenant=row.tenant, nonce=row.nonce, code_verifier=row.code_verifier,
                   next_path=row.next_path, step_up=row.step_up)


def mapped_roles(provider: OidcProvider, claims: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(roles, claim values)``: the approver roles ``role_map`` gives the values of the
    token's ``roles_claim`` (a string or a list of strings), sorted."""
    raw = claims.get(provider.roles_claim)
    values = [raw] if isinstance(raw, str) else [v for v in raw if isinstance(v, str)] \
        if isinstance(raw, list) else []
    roles = sorted({role for v in values for role in provider.role_map.get(v, ())})
    return roles, values


def _actor(subject: str | None) -> dict[str, Any]:
    return {"subject": subject or "anonymous", "principal_id": None, "kind": "oidc"}


async def record_refusal(db: Database, *, tenant: str, provider: OidcProvider,
                         error: SignInRefused, now: datetime, subject: str | None = None,
                         **details: Any) -> None:
    """Record a refused single sign-on as ``web.signin_refused`` in the tenant's chain.
    Only for refusals of what the provider answered (an ID token, its roles): a refusal
    anyone can cause without the provider (a bad ``state``, a made-up code) is a log line
    only (the web route logs every refusal), so an anonymous sender cannot write to a
    tenant's chain."""
    async with db.transaction() as conn:
        await append(conn, tenant, [Event(
            type="web.signin_refused", actor=_actor(subject), principal=subject,
            payload={"method": "oidc", "code": error.code, "reason": error.detail,
                     "issuer": provider.issuer, **details})], now=now)


async def sign_in(db: Database, *, tenant: str, provider: OidcProvider, token: IdToken,
                  clock: Clock, step_up: dict[str, Any] | None = None) -> Caller:
    """The caller a checked ID token signs in (module docstring). ``step_up``: what a
    step-up sign-in asked the provider for (``acr_values``, ``max_age``), recorded in
    ``web.signed_in``.

    Raises:
        SignInRefused: ``oidc_no_role``, ``oidc_subject_conflict``,
            ``oidc_principal_disabled``, ``oidc_bad_token`` (a subject that cannot be
            stored) — each recorded by :func:`record_refusal` before it is raised.
    """
    now = clock()
    spelt = subject_for(provider.issuer, token.sub)
    roles, values = mapped_roles(provider, token.claims)
    authn = Authn("oidc", acr=token.acr, amr=token.amr, auth_time=token.auth_time)
    try:
        subject = canonical_subject(spelt)
    except InvalidRequest as exc:
        error = SignInRefused(f"the provider's subject cannot be stored: {exc.detail}",
                              code="oidc_bad_token")
        await record_refusal(db, tenant=tenant, provider=provider, error=error, now=now)
        raise error from exc
    if not roles:
        error = SignInRefused("none of your groups gives an approver role here",
                              code="oidc_no_role")
        await _strip_roles(db, tenant, subject, spelt, now)
        await record_refusal(db, tenant=tenant, provider=provider, error=error, now=now,
                             subject=subject, claim=provider.roles_claim,
                             claim_values=[v[:100] for v in values[:_MAX_CLAIM_VALUES]])
        raise error
    try:
        principal_id = await _upsert(db, tenant, subject, spelt, roles, authn, provider, now,
                                     step_up)
    except SignInRefused as error:
        await record_refusal(db, tenant=tenant, provider=provider, error=error, now=now,
                             subject=subject)
        raise
    return Caller(tenant=tenant, principal_id=principal_id, subject=subject,
                  roles=frozenset(roles), kind="user", authn=authn)


async def _upsert(db: Database, tenant: str, subject: str, spelt: str, roles: list[str],
                  authn: Authn, provider: OidcProvider, now: datetime,
                  step_up: dict[str, Any] | None) -> str:
    who = {"subject": subject, "principal_id": None, "kind": "oidc"}
    async with db.transaction() as conn:
        row = (await conn.execute(select(
            principals.c.id, principals.c.roles, principals.c.display_name,
            principals.c.disabled, principals.c.kind).where(
            principals.c.tenant == tenant, principals.c.subject == subject))).first()
        events: list[Event] = []
        if row is None:
            try:
                principal_id, _ = await get_or_create_principal(
                    conn, tenant=tenant, subject=subject, display_name=spelt, roles=roles,
                    kind="user", now=now)
            except SubjectConflict as exc:  # created meanwhile under another spelling
                raise SignInRefused("another account already has this subject",
                                    code="oidc_subject_conflict") from exc
            events.append(Event(type="principal.created", actor=who, principal=subject,
                                payload={"principal_id": principal_id, "subject": subject,
                                         "display_name": spelt, "kind": "user",
                                         "roles": roles, "source": "oidc"}))
        else:
            if (row.display_name or subject) != spelt or row.kind != "user":
                raise SignInRefused("another account already has this subject",
                                    code="oidc_subject_conflict")
            if row.disabled:
                raise SignInRefused("this account is disabled in Cosigner",
                                    code="oidc_principal_disabled")
            principal_id = row.id
            if sorted(row.roles) != roles:
                await conn.execute(principals.update().where(principals.c.id == row.id)
                                   .values(roles=roles))
                events.append(Event(type="principal.updated", actor=who, principal=subject,
                                    payload={"principal_id": row.id, "subject": subject,
                                             "roles": roles, "previous_roles":
                                             sorted(row.roles), "source": "oidc"}))
        await conn.execute(principals.update().where(principals.c.id == principal_id)
                           .values(last_signed_in_at=now))
        events.append(Event(type="web.signed_in", actor={**who, "principal_id": principal_id},
                            principal=subject,
                            payload={"method": "oidc", "issuer": provider.issuer,
                                     "authn": authn.record(), "roles": roles,
                                     "step_up": step_up}))
        await append(conn, tenant, events, now=now)
    return principal_id


async def _strip_roles(db: Database, tenant: str, subject: str, spelt: str,
                       now: datetime) -> None:
    """A person whose groups no longer give a role loses the roles and web sessions an
    earlier sign-in gave them (only the principal of this exact spelling)."""
    async with db.transaction() as conn:
        row = (await conn.execute(select(principals.c.id, principals.c.roles,
                                         principals.c.display_name).where(
            principals.c.tenant == tenant, principals.c.subject == subject))).first()
        if row is None or row.display_name != spelt:
            return
        await conn.execute(delete(web_sessions).where(web_sessions.c.principal_id == row.id))
        if row.roles:
            await conn.execute(principals.update().where(principals.c.id == row.id)
                               .values(roles=[]))
            await append(conn, tenant, [Event(
                type="principal.updated", actor=_actor(subject), principal=subject,
                payload={"principal_id": row.id, "subject": subject, "roles": [],
                         "previous_roles": sorted(row.roles), "source": "oidc"})], now=now)
