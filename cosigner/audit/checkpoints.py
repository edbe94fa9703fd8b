"""Signed checkpoints of the per-tenant hash chain.

A checkpoint states "event ``seq`` of ``tenant`` has hash ``hash``" at ``time``, signed by the
keyring's current key as a compact JWS with ``typ: cosigner-checkpoint+jwt`` (claims
``{tenant, seq, hash, time}``; verifiable offline with the JWKS). Anyone holding a checkpoint
can detect a later rewrite, deletion or truncation of the events it covers.

:class:`Checkpointer` signs one for each tenant whose head moved at least ``every_events``
events, or moved at all and waited ``every_s`` seconds, since its last checkpoint. The app
lifespan runs :meth:`Checkpointer.run` in the background; :func:`checkpoint_now` signs one
on demand (the export does so before it fixes its range, so its tail is signed).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.core.clock import Clock, isoformat
from cosigner.core.errors import CosignerError
from cosigner.db.database import Database, UniqueViolation
from cosigner.db.tables import audit_events, audit_heads
from cosigner.db.tables_audit import audit_checkpoints
from cosigner.keys.keyring import Keyring

log = logging.getLogger("cosigner.audit")

CHECKPOINT_TYP = "cosigner-checkpoint+jwt"
"""JWS ``typ`` of checkpoints, so a checkpoint can never pass for a permit (and back)."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    tenant: str
    seq: int
    hash: str
    time: datetime
    kid: str
    token: str

    def as_dict(self) -> dict[str, Any]:
        """The wire/export form: ``{tenant, seq, hash, time, kid, token}``."""
        return {"tenant": self.tenant, "seq": self.seq, "hash": self.hash,
                "time": isoformat(self.time), "kid": self.kid, "token": self.token}


def row_to_checkpoint(row: Any) -> Checkpoint:
    return Checkpoint(tenant=row.tenant, seq=int(row.seq), hash=row.hash, time=_aware(row.time),
                      kid=row.kid, token=row.token)


def sign_checkpoint(keyring: Keyring, *, tenant: str, seq: int, hash_: str,
                    at: datetime) -> Checkpoint:
    """Sign ``{tenant, seq, hash, time}`` with the keyring's current key."""
    claims = {"tenant": tenant, "seq": seq, "hash": hash_, "time": isoformat(at)}
    token = keyring.sign(claims, typ=CHECKPOINT_TYP)
    return Checkpoint(tenant, seq, hash_, at, keyring.current_kid, token)


async def latest_checkpoint(conn: AsyncConnection, tenant: str, *,
                            at_or_below: int | None = None) -> Checkpoint | None:
    """The newest checkpoint of ``tenant`` (with ``seq <= at_or_below`` when given)."""
    query = select(audit_checkpoints).where(audit_checkpoints.c.tenant == tenant)
    if at_or_below is not None:
        query = query.where(audit_checkpoints.c.seq <= at_or_below)
    row = (await conn.execute(query.order_by(audit_checkpoints.c.seq.desc()).limit(1))).first()
    return None if row is None else row_to_checkpoint(row)


async def checkpoint_now(db: Database, keyring: Keyring, *, tenant: str,
                         now: datetime) -> Checkpoint | None:
    """Sign the tenant's current head unless it is already checkpointed.

    Returns the new checkpoint, or the existing one at the head, or ``None`` for a tenant
    with no events. Raises :class:`~cosigner.core.errors.Unavailable` when storage fails.
    """
    try:
        async with db.transaction() as conn:
            head = (await conn.execute(select(audit_heads.c.seq, audit_heads.c.hash)
                                       .where(audit_heads.c.tenant == tenant))).first()
            if head is None or int(head.seq) == 0:
                return None
            last = await latest_checkpoint(conn, tenant)
            if last is not None and last.seq >= int(head.seq):
                return last
            checkpoint = sign_checkpoint(keyring, tenant=tenant, seq=int(head.seq),
                                         hash_=str(head.hash), at=now)
            await conn.execute(audit_checkpoints.insert().values(
                tenant=tenant, seq=checkpoint.seq, hash=checkpoint.hash, time=now,
                kid=checkpoint.kid, token=checkpoint.token))
            return checkpoint
    except UniqueViolation:  # another replica signed the same head first
        async with db.read() as conn:
            return await latest_checkpoint(conn, tenant)


async def due_tenants(conn: AsyncConnection, *, every_events: int, every_s: float,
                      now: datetime) -> list[str]:
    """Tenants whose head is ``every_events`` past their last checkpoint, or past it at
    all while the oldest uncheckpointed event is ``every_s`` seconds old."""
    last = (select(audit_checkpoints.c.tenant, func.max(audit_checkpoints.c.seq).label("seq"))
            .group_by(audit_checkpoints.c.tenant).subquery())
    rows = (await conn.execute(
        select(audit_heads.c.tenant, audit_heads.c.seq, last.c.seq.label("cp_seq"))
        .select_from(audit_heads.outerjoin(last, last.c.tenant == audit_heads.c.tenant))
        .where(audit_heads.c.seq > func.coalesce(last.c.seq, 0))
    )).all()
    due: list[str] = []
    cutoff = now - timedelta(seconds=every_s)
    for row in rows:
        covered = int(row.cp_seq or 0)
        if int(row.seq) - covered >= every_events:
            due.append(row.tenant)
            continue
        first_time = (await conn.execute(
            select(audit_events.c.time).where(audit_events.c.tenant == row.tenant,
                                              audit_events.c.seq == covered + 1))).scalar()
        if first_time is None or _aware(first_time) <= cutoff:
            due.append(row.tenant)
    return due


def _aware(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes for UTC values; PostgreSQL aware ones."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class Checkpointer:
    """Signs due checkpoints every ``poll_s`` seconds (background task of the app)."""

    def __init__(self, db: Database, keyring: Keyring, clock: Clock, *, every_events: int,
                 every_s: float, poll_s: float | None = None) -> None:
        self.db, self.keyring, self.clock = db, keyring, clock
        self.every_events, self.every_s = every_events, every_s
        self.poll_s = poll_s if poll_s is not None else min(every_s, 1.0)

    async def run_once(self) -> list[Checkpoint]:
        """Sign a checkpoint for every due tenant; returns what was signed."""
        now = self.clock()
        async with self.db.read() as conn:
            tenants = await due_tenants(conn, every_events=self.every_events,
                                        every_s=self.every_s, now=now)
        signed = []
        for tenant in tenants:
            checkpoint = await checkpoint_now(self.db, self.keyring, tenant=tenant, now=now)
            if checkpoint is not None:
                signed.append(checkpoint)
        return signed

    async def run(self) -> None:
        """Loop until cancelled; a failed round is logged and retried next round."""
        while True:
            try:
                await self.run_once()
            except CosignerError as exc:
                log.warning("checkpoint round failed: %s", exc.detail)
            except Exception:  # noqa: BLE001 - keep the loop alive, say why in the log
                log.exception("checkpoint round failed")
            await asyncio.sleep(self.poll_s)
