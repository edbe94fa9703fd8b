"""Streaming export of one tenant's decision log (JSON Lines or CSV).

The exported range is always verifiable on its own: it starts right after a signed anchor
(the genesis, or the latest checkpoint before the first requested event — so a few events
before ``since`` may be included) and ends at a checkpoint when one exists at or after the
last requested event (an export without ``until`` first signs the current head). Rows are
read in batches by ``seq``, each batch in its own short read, so memory stays flat
whatever the size of the log.

JSON Lines, one object per line, in this order::

    {"kind": "header", "format": "cosigner-audit-export", "version": 1, "tenant": ...,
     "since": ..., "until": ..., "first_seq": ..., "last_seq": ...,
     "anchor": {"seq": ..., "hash": ...}}
    {"kind": "checkpoint", "tenant", "seq", "hash", "time", "kid", "token"}   (anchor's)
    {"kind": "event", "hash": ..., "body": {...canonical event body...}}
    {"kind": "checkpoint", ...}            (right after the event it covers)

CSV has one row per event (with ``body`` and ``hash`` columns) and no checkpoints; use
JSON Lines for offline verification (``cosigner audit verify``).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

from sqlalchemy import func, select, type_coerce

from cosigner.audit.chain import GENESIS
from cosigner.audit.checkpoints import checkpoint_now, row_to_checkpoint
from cosigner.audit.query import utc
from cosigner.core.clock import isoformat
from cosigner.db import event_row
from cosigner.db.database import Database
from cosigner.db.driver_types import RawBlob
from cosigner.db.tables import audit_events
from cosigner.db.tables_audit import audit_checkpoints
from cosigner.keys.keyring import Keyring

EXPORT_FORMAT = "cosigner-audit-export"
EXPORT_VERSION = 1
BATCH = 1000
Format = Literal["jsonl", "csv"]
CSV_COLUMNS = ("seq", "time", "type", "tenant", "actor", "decision_id", "approval_id",
               "permit_jti", "run_id", "tool", "effect", "args_hash", "policy_id",
               "policy_version", "prev_hash", "hash", "body")


@dataclass(frozen=True, slots=True)
class ExportRange:
    """The contiguous ``seq`` range ``first_seq..last_seq`` and its anchor."""

    tenant: str
    since: datetime | None
    until: datetime | None
    first_seq: int
    last_seq: int
    anchor_seq: int
    anchor_hash: str

    @property
    def empty(self) -> bool:
        return self.last_seq < self.first_seq

    def header(self) -> dict[str, Any]:
        return {"kind": "header", "format": EXPORT_FORMAT, "version": EXPORT_VERSION,
                "tenant": self.tenant,
                "since": isoformat(self.since) if self.since else None,
                "until": isoformat(self.until) if self.until else None,
                "first_seq": self.first_seq, "last_seq": self.last_seq,
                "anchor": {"seq": self.anchor_seq, "hash": self.anchor_hash}}


async def plan_export(db: Database, keyring: Keyring, *, tenant: str,
                      since: datetime | None, until: datetime | None,
                      now: datetime) -> ExportRange:
    """Fix the range to export (see the module docstring). Raises ``Unavailable``."""
    head_cp = None
    if until is None:
        head_cp = await checkpoint_now(db, keyring, tenant=tenant, now=now)
    ev, cp = audit_events.c, audit_checkpoints.c
    async with db.read(bulk=True) as conn:
        low, high = (await conn.execute(select(func.min(ev.seq), func.max(ev.seq))
                                        .where(ev.tenant == tenant))).one()
        empty = ExportRange(tenant, since, until, 1, 0, 0, GENESIS)
        if low is None:
            return empty
        first_q = select(func.min(ev.seq)).where(ev.tenant == tenant)
        if since is not None:
            first_q = first_q.where(ev.time >= utc(since))
        last_q = select(func.max(ev.seq)).where(ev.tenant == tenant)
        if until is not None:
            last_q = last_q.where(ev.time < utc(until))
        first = (await conn.execute(first_q)).scalar()
        last = head_cp.seq if head_cp is not None else (await conn.execute(last_q)).scalar()
        if first is None or last is None or last < first:
            return empty
        anchor_seq = (await conn.execute(
            select(func.max(cp.seq)).where(cp.tenant == tenant, cp.seq < first,
                                           cp.seq >= int(low) - 1))).scalar()
        first = int(anchor_seq) + 1 if anchor_seq is not None else int(low)
        closing = (await conn.execute(
            select(func.min(cp.seq)).where(cp.tenant == tenant, cp.seq >= last,
                                           cp.seq <= int(high)))).scalar()
        last = int(closing) if closing is not None else int(last)
        body = (await conn.execute(select(event_row.lenient(ev.body)).where(
            ev.tenant == tenant, ev.seq == first))).scalar_one()
        try:
            anchor_hash = str(event_row.document(body, tenant=tenant, seq=first)["prev_hash"])
        except (event_row.EventUnreadable, KeyError):
            # The first event does not read (its row before deleted by hand, its bytes
            # damaged): the anchor is the signed checkpoint's hash, if there is one; the
            # event itself is left out of the export like any other that does not read.
            anchor_hash = str((await conn.execute(select(cp.hash).where(
                cp.tenant == tenant, cp.seq == first - 1))).scalar() or "")
    return ExportRange(tenant, since, until, first, last, first - 1, anchor_hash)


class _Event(NamedTuple):
    seq: int
    body: str
    hash: str


async def _batches(db: Database, rng: ExportRange, batch: int
                   ) -> AsyncIterator[tuple[Sequence[_Event], dict[int, Any]]]:
    """``(events, checkpoints by seq)`` in ``seq`` order, ``batch`` events at a time.

    The stored bodies are read with the row before the batch and resolved in order
    (:func:`cosigner.db.event_row.texts_in_order`): the same texts as selecting
    ``audit_events.body``, without a lookup of the row before for each row."""
    ev, cp = audit_events.c, audit_checkpoints.c
    after = rng.first_seq - 1
    while after < rng.last_seq:
        async with db.read(bulk=True) as conn:
            rows = (await conn.execute(
                select(ev.seq, type_coerce(ev.body, RawBlob), ev.hash)
                .where(ev.tenant == rng.tenant, ev.seq >= after, ev.seq <= rng.last_seq)
                .order_by(ev.seq).limit(batch + 1))).all()
            skip = 1 if rows and int(rows[0][0]) == after else 0
            if len(rows) <= skip:
                return
            top = int(rows[-1][0])
            cps = (await conn.execute(select(audit_checkpoints).where(
                cp.tenant == rng.tenant, cp.seq > after, cp.seq <= top))).all()
        texts = event_row.texts_in_order(
            [(int(seq), stored, digest) for seq, stored, digest in rows], skip=skip)
        # An event that does not read (its row before deleted by hand, its bytes
        # damaged) is left out, logged: the verifier reports the gap, as for the deleted
        # row itself.
        events = []
        for row, body in zip(rows[skip:], texts, strict=True):
            if isinstance(body, event_row.Unreadable):
                body.error.tenant = rng.tenant
                event_row.note_left_out(body.error, "the export")
            else:
                events.append(_Event(int(row[0]), body, row[2]))
        yield events, {int(c.seq): c for c in cps}
        after = top


def _checkpoint_line(row: Any) -> str:
    return json.dumps({"kind": "checkpoint", **row_to_checkpoint(row).as_dict()},
                      ensure_ascii=False) + "\n"


async def export_jsonl(db: Database, rng: ExportRange, *, batch: int = BATCH
                       ) -> AsyncIterator[str]:
    """The JSON Lines export of ``rng``, one chunk of lines per batch."""
    yield json.dumps(rng.header(), ensure_ascii=False) + "\n"
    if rng.empty:
        return
    async with db.read(bulk=True) as conn:
        anchor = (await conn.execute(select(audit_checkpoints).where(
            audit_checkpoints.c.tenant == rng.tenant,
            audit_checkpoints.c.seq == rng.anchor_seq))).first()
    if anchor is not None:
        yield _checkpoint_line(anchor)
    async for rows, cps in _batches(db, rng, batch):
        out: list[str] = []
        for row in rows:
            # The stored body is already canonical JSON: embed it without re-encoding.
            out.append(f'{{"kind":"event","hash":"{row.hash}","body":{row.body}}}\n')
            if int(row.seq) in cps:
                out.append(_checkpoint_line(cps[int(row.seq)]))
        yield "".join(out)


async def export_csv(db: Database, rng: ExportRange, *, batch: int = BATCH
                     ) -> AsyncIterator[str]:
    """The CSV export of ``rng`` (header row, then one row per event)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    yield buffer.getvalue()
    if rng.empty:
        return
    async for rows, _ in _batches(db, rng, batch):
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        for row in rows:
            body = event_row.readable(row.body, tenant=rng.tenant, seq=row.seq,
                                      reader="the CSV export")
            if body is None:  # a text that decodes but is not a JSON object
                continue
            policy = body.get("policy") or {}
            subject = body.get("subject") or {}
            writer.writerow([
                body["seq"], body["time"], body["type"], body["tenant"],
                (body.get("actor") or {}).get("subject", ""),
                subject.get("decision_id", ""), subject.get("approval_id", ""),
                subject.get("permit_jti", ""), subject.get("run_id", ""),
                body.get("tool") or "", body.get("effect") or "", body.get("args_hash") or "",
                policy.get("id", ""), policy.get("version", ""), body["prev_hash"], row.hash,
                row.body])
        yield buffer.getvalue()


async def export(db: Database, keyring: Keyring, *, tenant: str, fmt: Format,
                 since: datetime | None, until: datetime | None, now: datetime,
                 batch: int = BATCH) -> AsyncIterator[str]:
    """Plan the range, then return the chunk iterator of the chosen format."""
    rng = await plan_export(db, keyring, tenant=tenant, since=since, until=until, now=now)
    return export_jsonl(db, rng, batch=batch) if fmt == "jsonl" else export_csv(
        db, rng, batch=batch)
