"""Slack users linked to Cosigner principals, through a one-time link the person confirms
while signed in to Cosigner.

An unlinked user's click gets a link URL (:func:`issue_token`): 256 bits derived from a
random seed under the tenant's signing secret, only the seed and the token's SHA-256
stored, bound to the tenant, the Slack team and the Slack user, valid
``settings.slack_link_ttl_s``, usable once; one per Slack user at a time (clicking again
sends the same link while at least half its lifetime is left). Opened while signed in to
the tenant's web pages, it shows what will be linked; the confirming POST (CSRF-checked by the page)
calls :func:`confirm`, which spends the token and stores (tenant, team, user) → principal,
logged ``slack.linked``. A link belongs to its tenant: :func:`caller_for` only ever reads
the link of the tenant the click was verified for, and builds the :class:`Caller` from the
principal's *current* row (roles; a disabled principal is refused), and only while the
principal's last web sign-in is recent (``settings.slack_signin_max_age``: roles a single
sign-on gave are confirmed at the provider only when the person signs in).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update

from cosigner.audit.chain import Event, append
from cosigner.core.errors import Forbidden, NotFound
from cosigner.db.database import Database
from cosigner.db.tables import principals
from cosigner.db.tables_slack import slack_link_tokens, slack_links
from cosigner.identity.principals import Authn, Caller

SLACK_AUTHN = Authn("slack")


@dataclass(frozen=True, slots=True)
class SlackUser:
    """Who clicked, as Slack's signed payload says: workspace, user id, user name."""

    team_id: str
    user_id: str
    name: str = ""

    def actor(self) -> dict[str, Any]:
        """The ``actor`` of events about a click no principal is linked to."""
        return {"subject": f"slack:{self.team_id}/{self.user_id}", "principal_id": None,
                "kind": "slack"}


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def link_url(public_url: str, token: str) -> str:
    return f"{public_url.rstrip('/')}/ui/slack/link/{token}"


def _derive(secret: str, seed: str) -> str:
    """The URL token of ``seed``: HMAC-SHA256 under the tenant's signing secret."""
    digest = hmac.new(secret.encode(), b"cosigner-slack-link-v1\0" + seed.encode(),
                      hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


async def issue_token(db: Database, *, tenant: str, user: SlackUser, now: datetime,
                      ttl_s: int, secret: str) -> tuple[str, datetime]:
    """A one-time link token for ``user`` in ``tenant`` and when it expires.

    At most one token per (tenant, team, user) is kept: a live unused one with at least
    half of ``ttl_s`` left is sent again (re-derived from its stored random seed with
    ``secret``, the tenant's Slack signing secret; only the seed and the token's SHA-256
    are stored, so the database alone yields no usable token). Otherwise the user's
    tokens are deleted and a fresh one is stored. A new ``secret`` simply makes new tokens.
    """
    mine = ((slack_link_tokens.c.tenant == tenant)
            & (slack_link_tokens.c.team_id == user.team_id)
            & (slack_link_tokens.c.user_id == user.user_id))
    async with db.transaction() as conn:
        rows = (await conn.execute(select(
            slack_link_tokens.c.token_hash, slack_link_tokens.c.seed,
            slack_link_tokens.c.expires_at).where(
            mine, slack_link_tokens.c.used_at.is_(None), slack_link_tokens.c.seed.is_not(None),
            slack_link_tokens.c.expires_at > now + timedelta(seconds=ttl_s / 2)))).all()
        for row in rows:
            token = _derive(secret, row.seed)
            if hmac.compare_digest(_hash(token), row.token_hash):
                await conn.execute(delete(slack_link_tokens).where(
                    mine, slack_link_tokens.c.token_hash != row.token_hash))
                return token, _aware(row.expires_at)
        await conn.execute(delete(slack_link_tokens).where(mine))
        seed = secrets.token_urlsafe(32)
        token, expires = _derive(secret, seed), now + timedelta(seconds=ttl_s)
        await conn.execute(slack_link_tokens.insert().values(
            token_hash=_hash(token), tenant=tenant, team_id=user.team_id,
            user_id=user.user_id, user_name=user.name[:256] or None, created_at=now,
            expires_at=expires, used_at=None, seed=seed))
    return token, expires


async def pending_link(db: Database, caller: Caller, token: str, *,
                       now: datetime) -> SlackUser:
    """The Slack user a link token would link to ``caller`` (nothing is changed).

    Raises:
        NotFound: ``not_found`` — unknown, expired or spent token.
        Forbidden: ``forbidden`` — the token was issued for another tenant.
    """
    async with db.read() as conn:
        row = (await conn.execute(select(slack_link_tokens).where(
            slack_link_tokens.c.token_hash == _hash(token[:100])))).first()
    if row is None or row.used_at is not None or now >= _aware(row.expires_at):
        raise NotFound("this link is unknown, expired or already used; click the button "
                       "in Slack again for a new one")
    if row.tenant != caller.tenant:
        raise Forbidden("this link belongs to another Cosigner tenant")
    return SlackUser(row.team_id, row.user_id, row.user_name or "")


async def confirm(db: Database, caller: Caller, token: str, *, now: datetime) -> SlackUser:
    """Spend the token and link its Slack user to ``caller`` (replacing an earlier link of
    that Slack user in this tenant); logs ``slack.linked`` in the tenant's chain.

    Raises:
        NotFound, Forbidden: as :func:`pending_link` (checked again under the write).
    """
    user = await pending_link(db, caller, token, now=now)
    async with db.transaction() as conn:
        spent = await conn.execute(update(slack_link_tokens).where(
            slack_link_tokens.c.token_hash == _hash(token[:100]),
            slack_link_tokens.c.tenant == caller.tenant,
            slack_link_tokens.c.used_at.is_(None),
            slack_link_tokens.c.expires_at > now).values(used_at=now))
        if spent.rowcount != 1:  # another request spent it first
            raise NotFound("this link is unknown, expired or already used")
        await conn.execute(delete(slack_links).where(
            slack_links.c.tenant == caller.tenant, slack_links.c.team_id == user.team_id,
            slack_links.c.user_id == user.user_id))
        await conn.execute(slack_links.insert().values(
            tenant=caller.tenant, team_id=user.team_id, user_id=user.user_id,
            user_name=user.name[:256] or None, principal_id=caller.principal_id,
            created_at=now))
        await append(conn, caller.tenant, [Event(
            type="slack.linked", actor=caller.actor(), principal=caller.subject,
            payload={"team_id": user.team_id, "user_id": user.user_id,
                     "principal_id": caller.principal_id})], now=now)
    return user


async def caller_for(db: Database, tenant: str, user: SlackUser, *,
                     signed_in_after: datetime,
                     passwords_allowed: bool = True) -> Caller | None:
    """The :class:`Caller` of ``user``'s link in ``tenant`` (``authn`` ``slack``, roles
    as stored now), or ``None`` when the user is not linked in this tenant — or is linked
    to a password account while ``passwords_allowed`` is false (the tenant's
    ``allow_passwords`` was switched off after the link was made: the link is void, and
    a new one can only be confirmed by a single sign-on session).

    ``signed_in_after``: the principal's last web sign-in
    (``principals.last_signed_in_at``) must be later. Roles from single sign-on are
    refreshed only at a sign-in, so a person removed from their groups at the provider,
    or deprovisioned there, keeps no authority in Slack past this; a link whose principal
    never signed in since migration 0018 (``NULL``) is stale too.

    Raises:
        Forbidden: ``principal_disabled`` — the linked principal is disabled;
            ``slack_signin_stale`` — its last sign-in is not after ``signed_in_after``.
    """
    async with db.read() as conn:
        row = (await conn.execute(
            select(principals.c.id, principals.c.tenant, principals.c.subject,
                   principals.c.roles, principals.c.disabled, principals.c.password_hash,
                   principals.c.last_signed_in_at)
            .join(slack_links, slack_links.c.principal_id == principals.c.id)
            .where(slack_links.c.tenant == tenant, slack_links.c.team_id == user.team_id,
                   slack_links.c.user_id == user.user_id,
                   principals.c.tenant == tenant))).first()
    if row is None or (not passwords_allowed and row.password_hash is not None):
        return None
    if row.disabled:
        raise Forbidden("the linked Cosigner principal is disabled", code="principal_disabled")
    if row.last_signed_in_at is None or _aware(row.last_signed_in_at) <= signed_in_after:
        raise Forbidden("the linked principal has not signed in to Cosigner recently",
                        code="slack_signin_stale")
    return Caller(tenant=row.tenant, principal_id=row.id, subject=row.subject,
                  roles=frozenset(row.roles), kind="user", authn=SLACK_AUTHN)
