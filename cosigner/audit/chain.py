"""Appending events to the per-tenant hash chain.

Each event's body is an object; its canonical form (RFC 8785) includes ``prev_hash``,
and ``hash = "sha256:" + hex(SHA-256(canonical body))``. The first event of a tenant
links to :data:`GENESIS`. ``append`` runs inside the caller's transaction, so an event
commits together with the state change it records, or not at all (invariant 2).

Storage: each row's body leaves its ``prev_hash`` to the row before it, and two
consecutive events of one decision (or approval request) share one compressed frame
(:mod:`cosigner.db.event_row`); reads give back the exact text that was hashed.

Concurrency: the tenant's head row is locked (SQLite: the write transaction already
holds the database lock via BEGIN IMMEDIATE; PostgreSQL: ``SELECT ... FOR UPDATE``),
so concurrent writers on several replicas still produce one linear chain.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import bindparam, false, func, select
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.audit.events import SCHEMA_VERSION, Event, stored_bytes
from cosigner.core.canonical import canonicalize, hash_bytes
from cosigner.db import event_row, raw_pg
from cosigner.db.database import dialect_insert
from cosigner.db.raw_insert import (
    insert_many,
    raw_sqlite,
    sqlite_many,
    sqlite_query,
    sqlite_rows,
)
from cosigner.db.tables import audit_events, audit_heads

__all__ = ["GENESIS", "SCHEMA_VERSION", "Event", "append", "append_pg", "append_raw",
           "lock_head", "verify_bodies"]

GENESIS = "sha256:" + "0" * 64


#: Whether the head's own event row is there: when it was deleted by hand, the next event
#: keeps its ``prev_hash`` in its own row (:mod:`cosigner.db.event_row`), so it still reads.
#: Written as "the first seq at or after the head's is the head's" so that the only plan
#: is a probe of the ``(tenant, seq)`` key: PostgreSQL's generic plan of ``EXISTS (…
#: seq = …)``, made on a fresh (empty) database, searched ``(tenant, time)`` and
#: filtered on seq — a scan of the tenant's events per head lock (as in
#: :mod:`cosigner.db.raw_pg`'s ``_HEAD``).
_HEAD_ROW = func.coalesce(
    select(audit_events.c.seq).where(audit_events.c.tenant == audit_heads.c.tenant,
                                     audit_events.c.seq >= audit_heads.c.seq)
    .order_by(audit_events.c.seq).limit(1).correlate(audit_heads).scalar_subquery()
    == audit_heads.c.seq, false())
_HEAD = select(audit_heads.c.seq, audit_heads.c.hash, _HEAD_ROW.label("present")).where(
    audit_heads.c.tenant == bindparam("tenant"))
_HEAD_FOR_UPDATE = _HEAD.with_for_update()


@lru_cache(maxsize=2)
def _new_head(dialect: str) -> Any:
    """The genesis head's ``INSERT ... ON CONFLICT DO NOTHING``, built once per dialect."""
    return dialect_insert(dialect)(audit_heads).values(
        tenant=bindparam("tenant"), seq=0, hash=GENESIS).on_conflict_do_nothing(
        index_elements=["tenant"])


_MOVE_HEAD = audit_heads.update().where(audit_heads.c.tenant == bindparam("head_tenant")).values(
    seq=bindparam("head_seq"), hash=bindparam("head_hash"))


async def lock_head(conn: AsyncConnection, tenant: str) -> tuple[int, str]:
    """The tenant's chain head, locked for this transaction (PostgreSQL: ``FOR UPDATE``;
    SQLite: the write transaction holds the database). Created at genesis the first time.
    Statements are built once, values bound per call."""
    seq, digest, _ = await _lock_head(conn, tenant)
    return seq, digest


async def _lock_head(conn: AsyncConnection, tenant: str) -> tuple[int, str, bool]:
    """:func:`lock_head` and whether the head's event row is there."""
    pg = conn.dialect.name == "postgresql"
    query = _HEAD_FOR_UPDATE if pg else _HEAD
    row = (await conn.execute(query, {"tenant": tenant})).first()
    if row is None:
        await conn.execute(_new_head("postgresql" if pg else "sqlite"), {"tenant": tenant})
        row = (await conn.execute(query, {"tenant": tenant})).one()
    return int(row.seq), str(row.hash), bool(row.present)


async def append(conn: AsyncConnection, tenant: str, events: list[Event],
                 *, now: datetime, first_alone: bool = False) -> list[dict[str, Any]]:
    """Append ``events`` in order to ``tenant``'s chain inside the open transaction.

    Returns the stored bodies (each with ``seq`` and ``prev_hash``) plus their ``hash``.
    Database errors propagate to ``Database.transaction`` (→ 503). On a file SQLite
    database the head is read and moved, and the events inserted, on the transaction's
    own ``sqlite3`` connection (the same statements, without SQLAlchemy's execute).
    ``first_alone``: the head's row is gone (:mod:`cosigner.audit.prune` deleted it), so
    the first event keeps its ``prev_hash`` in its own row — as it does whenever the head
    read finds the head's row missing (deleted by hand).
    """
    raw = await raw_sqlite(conn)
    if raw is not None:
        return append_raw(raw, conn.dialect, tenant, events, now=now,
                          first_alone=first_alone)
    seq, prev, present = await _lock_head(conn, tenant)
    stored, rows = _chain(tenant, events, seq, prev, now,
                          first_alone=first_alone or not present)
    if stored:
        seq, prev = stored[-1]["seq"], stored[-1]["hash"]
    await insert_many(conn, audit_events, rows)  # the raw driver's executemany
    await conn.execute(_MOVE_HEAD, {"head_tenant": tenant, "head_seq": seq, "head_hash": prev})
    return stored


def append_raw(raw: sqlite3.Connection, dialect: Dialect, tenant: str, events: list[Event],
               *, now: datetime, first_alone: bool = False) -> list[dict[str, Any]]:
    """:func:`append` on a SQLite write transaction's own ``sqlite3`` connection (the same
    statements: the head read, created at genesis, the events' rows, the head moved)."""
    head = sqlite_query(raw, _RAW_HEAD, (tenant,))
    if not head:
        sqlite_query(raw, _RAW_NEW_HEAD, (tenant, GENESIS))
        head = sqlite_query(raw, _RAW_HEAD, (tenant,))
    seq, prev = int(head[0][0]), str(head[0][1])
    stored, rows = _chain(tenant, events, seq, prev, now,
                          first_alone=first_alone or not head[0][2])
    if stored:
        seq, prev = stored[-1]["seq"], stored[-1]["hash"]
        sqlite_many(raw, *sqlite_rows(dialect, audit_events, rows))
    sqlite_query(raw, _RAW_MOVE_HEAD, (seq, prev, tenant))
    return stored


async def append_pg(conn: Any, dialect: Dialect, tenant: str, events: list[Event],
                    *, now: datetime) -> list[dict[str, Any]]:
    """:func:`append` on a PostgreSQL batch's own asyncpg connection
    (:mod:`cosigner.db.raw_pg`: the head locked ``FOR UPDATE``, created at genesis; the
    events' rows and the head moved in one statement)."""
    seq, prev, present = await raw_pg.lock_head(conn, tenant, GENESIS)
    stored, rows = _chain(tenant, events, seq, prev, now, first_alone=not present)
    if stored:
        seq, prev = stored[-1]["seq"], stored[-1]["hash"]
    await raw_pg.extend_chain(conn, dialect, audit_events, tenant, rows, seq, prev)
    return stored


_RAW_HEAD = ("SELECT seq, hash, EXISTS (SELECT 1 FROM audit_events WHERE audit_events.tenant "
             "= audit_heads.tenant AND audit_events.seq = audit_heads.seq) FROM audit_heads "
             "WHERE tenant = ?")
_RAW_NEW_HEAD = ("INSERT INTO audit_heads (tenant, seq, hash) VALUES (?, 0, ?) "
                 "ON CONFLICT (tenant) DO NOTHING")
_RAW_MOVE_HEAD = "UPDATE audit_heads SET seq = ?, hash = ? WHERE tenant = ?"


def _chain(tenant: str, events: list[Event], seq: int, prev: str, now: datetime,
           *, first_alone: bool = False
           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The stored bodies (with their hash) and the ``audit_events`` rows of ``events``
    chained after ``(seq, prev)``. ``first_alone``: the row ``seq`` is not there to read
    the first event's ``prev_hash`` from (an event a prune appends)."""
    stored: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    texts: list[bytes] = []
    prevs: list[str] = []
    before_first = seq > 0 and not first_alone
    for event in events:
        seq += 1
        at = event.time or now
        body, text, digest = stored_bytes(event, tenant=tenant, seq=seq, time=at,
                                          prev_hash=prev)
        policy = event.policy or {}
        rows.append({
            "tenant": tenant, "seq": seq, "type": event.type, "time": at,
            "decision_id": event.decision_id, "approval_id": event.approval_id,
            "permit_jti": event.permit_jti, "run_id": event.run_id, "tool": event.tool,
            "effect": event.effect, "principal": event.principal,
            "policy_id": policy.get("id"), "policy_version": policy.get("version"),
            "mode": event.mode, "body": None, "hash": digest,
        })
        texts.append(text)
        prevs.append(prev)
        body["hash"] = digest
        stored.append(body)
        prev = digest
    _pack(events, rows, texts, prevs, before_first)
    return stored, rows


def _pack(events: list[Event], rows: list[dict[str, Any]], texts: list[bytes],
          prevs: list[str], before_first: bool) -> None:
    """Each row's stored ``body`` (:mod:`cosigner.db.event_row`): two consecutive events
    of one decision (or approval) share one frame, the second's row pointing at the
    first's; ``prev_hash`` is left to the row before, but for the first event when that
    row is not there (``before_first`` false)."""
    i, n = 0, len(events)
    while i < n:
        before = prevs[i] if i > 0 or before_first else None
        if i + 1 < n and _one_subject(events[i], events[i + 1]):
            pair = event_row.pack_pair(texts[i], before, texts[i + 1], prevs[i + 1])
            if pair is not None:
                rows[i]["body"], rows[i + 1]["body"] = pair
                i += 2
                continue
        rows[i]["body"] = event_row.pack_single(texts[i], before)
        i += 1


def _one_subject(first: Event, second: Event) -> bool:
    """True for two events of one decision, or of one approval request."""
    if first.decision_id is not None:
        return first.decision_id == second.decision_id
    return first.approval_id is not None and first.approval_id == second.approval_id


def verify_bodies(bodies: list[tuple[str, str]], *, start_prev: str = GENESIS,
                  start_seq: int = 1) -> tuple[int | None, str | None]:
    """Check stored ``(body text, hash)`` pairs form an unbroken chain.

    Returns ``(None, None)`` when intact, else ``(seq, fault)`` of the first bad event,
    fault one of ``hash_mismatch``, ``broken_link``, ``seq_gap``.
    """
    import json

    prev, expected = start_prev, start_seq
    for text, digest in bodies:
        body = json.loads(text)
        seq = body.get("seq")
        if hash_bytes(canonicalize(body)) != digest:
            return seq, "hash_mismatch"
        if seq != expected:
            return expected, "seq_gap"
        if body.get("prev_hash") != prev:
            return seq, "broken_link"
        prev, expected = digest, expected + 1
    return None, None
