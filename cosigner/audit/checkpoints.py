"""Signed checkpoints of the per-tenant hash chain.

A checkpoint states "event ``seq`` of ``tenant`` has hash ``hash``" at ``time``, signed by the
keyring's current key as a compact JWS with ``typ: cosigner-checkpoint+jwt`` (claims
``{tenant, seq, hash, time}``; verifiable offline with the JWKS). Anyone holding a checkpoint
can detect a later rewrite, deletion or truncation of the events it covers.

:class:`Checkpointer` signs one for each tenant whose head moved at least ``every_events``
events, or moved at all and waited ``every_s`` seconds, since its last checkpoint; a round
with nothing due costs one read of the heads. The app lifespan runs
:meth:`Checkpointer.run` in the background; :func:`checkpoint_now` signs one
on demand (the export does so before it fixes its range, so its tail is signed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.core.clock import Clock, isoformat
from cosigner.core.errors import CosignerError
from cosigner.db.database import Database, UniqueViolation
from cosigner.db.polls import poll_rows
from cosigner.db.raw_sql import RawStatement
from cosigner.db.tables import audit_events, audit_heads
from cosigner.db.tables_audit import audit_checkpoints
from cosigner.keys.keyring import Keyring

log = logging.getLogger("cosigner.audit")

CHECKPOINT_TYP = "cosigner-checkpoint+jwt"
"""JWS ``typ`` of checkpoints, so a checkpoint can never pass for a permit (and back)."""

#: How often (s) :class:`Checkpointer` re-reads every tenant's newest checkpoint.
COVERED_REFRESH_S = 60.0


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


_HEADS = RawStatement(select(audit_heads.c.tenant, audit_heads.c.seq))
_COVERED = RawStatement(select(audit_checkpoints.c.tenant, func.max(audit_checkpoints.c.seq))
                        .group_by(audit_checkpoints.c.tenant))
_COVERED_ONE = RawStatement(select(func.max(audit_checkpoints.c.seq))
                            .where(audit_checkpoints.c.tenant == bindparam("tenant")))
_EVENT_TIME = RawStatement(select(audit_events.c.time).where(
    audit_events.c.tenant == bindparam("tenant"), audit_events.c.seq == bindparam("seq")))


async def read_heads(db: Database) -> dict[str, int]:
    """Each tenant's head ``seq`` (one statement)."""
    return {tenant: int(seq) for tenant, seq in await poll_rows(db, _HEADS)}


async def covered_seqs(db: Database, tenant: str | None = None) -> dict[str, int]:
    """The ``seq`` of each tenant's newest checkpoint (of ``tenant`` only when given;
    one statement, by the primary key ``(tenant, seq)``)."""
    if tenant is None:
        return {t: int(seq) for t, seq in await poll_rows(db, _COVERED)}
    rows = await poll_rows(db, _COVERED_ONE, {"tenant": tenant})
    return {tenant: int(rows[0][0] or 0)} if rows else {}


async def event_time(db: Database, tenant: str, seq: int) -> datetime | None:
    """When event ``seq`` of ``tenant`` was logged (``None``: no such event)."""
    rows = await poll_rows(db, _EVENT_TIME, {"tenant": tenant, "seq": seq})
    return _aware(rows[0][0]) if rows and rows[0][0] is not None else None


def _aware(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes for UTC values; PostgreSQL aware ones."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class Checkpointer:
    """Signs due checkpoints every ``poll_s`` seconds (background task of the app).

    A round reads the heads (one statement) and compares them with what it remembers:
    each tenant's newest checkpoint ``seq`` (all of them re-read every
    :data:`COVERED_REFRESH_S`, and a tenant's own just before signing for it) and the time
    of the first event past it (read once per checkpoint). Remembered values only lag
    behind the database (checkpoints and events are never rewritten), so a lag can only
    make a tenant look due early; it is then re-read before anything is signed. A round
    where no tenant is due therefore costs one statement, whatever the load.
    """

    def __init__(self, db: Database, keyring: Keyring, clock: Clock, *, every_events: int,
                 every_s: float, poll_s: float | None = None) -> None:
        self.db, self.keyring, self.clock = db, keyring, clock
        self.every_events, self.every_s = every_events, every_s
        self.poll_s = poll_s if poll_s is not None else min(every_s, 1.0)
        self._covered: dict[str, int] | None = None
        self._covered_at = 0.0  # time.monotonic() of the last full read of _covered
        #: tenant → (covered seq, time of event covered + 1)
        self._first: dict[str, tuple[int, datetime | None]] = {}

    async def run_once(self) -> list[Checkpoint]:
        """Sign a checkpoint for every due tenant; returns what was signed (or found
        already signed at the head).

        Raises:
            Unavailable: storage fails.
        """
        now = self.clock()
        if self._covered is None or time.monotonic() - self._covered_at >= COVERED_REFRESH_S:
            self._covered = await covered_seqs(self.db)
            self._covered_at = time.monotonic()
        covered = self._covered
        signed = []
        for tenant, head in (await read_heads(self.db)).items():
            if head < covered.get(tenant, 0):  # a log replaced under us: read all again
                self._covered = None
                continue
            if not await self._due(tenant, head, covered.get(tenant, 0), now):
                continue
            covered.update(await covered_seqs(self.db, tenant))  # the database's word
            if not await self._due(tenant, head, covered.get(tenant, 0), now):
                continue
            checkpoint = await checkpoint_now(self.db, self.keyring, tenant=tenant, now=now)
            if checkpoint is not None:
                covered[tenant] = max(covered.get(tenant, 0), checkpoint.seq)
                signed.append(checkpoint)
        return signed

    async def _due(self, tenant: str, head: int, covered: int, now: datetime) -> bool:
        """Whether ``tenant``'s head is ``every_events`` past ``covered``, or past it at all
        while the first event past it is ``every_s`` seconds old."""
        if head <= covered:
            return False
        if head - covered >= self.every_events:
            return True
        first = self._first.get(tenant)
        if first is None or first[0] != covered:
            first = self._first[tenant] = (covered,
                                           await event_time(self.db, tenant, covered + 1))
        return first[1] is None or first[1] <= now - timedelta(seconds=self.every_s)

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
