"""Review probes (session 8 review) of events stored against the row before them
(cosigner.db.event_row): rows deleted by hand, behind ``cosigner audit prune``'s back,
leave the next row unreadable (its ``prev_hash``, or its whole text for a pair's tail, was
in the deleted row). The export must still be produced, and the offline verifier report
the deletion where it is, as it did when every row held its own text."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select, type_coerce

from cosigner.audit.verify import verify_export
from cosigner.core.canonical import hash_bytes
from cosigner.db import event_row
from cosigner.db.driver_types import RawBlob
from cosigner.db.tables import audit_events
from tests.audit.conftest import checkpoint, decide, export_lines, jwks
from tests.conftest import Harness


async def _forms(h: Harness, tenant: str) -> dict[int, int]:
    ev = audit_events.c
    async with h.db.read() as conn:
        rows = (await conn.execute(select(ev.seq, type_coerce(ev.body, RawBlob)).where(
            ev.tenant == tenant).order_by(ev.seq))).all()
    return {int(s): bytes(b)[0] for s, b in rows}


async def _delete(h: Harness, tenant: str, *where: Any) -> None:
    async with h.db.transaction() as conn:
        await conn.execute(audit_events.delete().where(audit_events.c.tenant == tenant,
                                                       *where))


async def _seed(h: Harness, tenant: str) -> tuple[dict[str, str], dict[int, int]]:
    runtime = await h.headers(tenant, "runtime")
    auditor = await h.headers(tenant, "auditor")
    for amount in (5000, 150000, 250000, 5000, 250000, 5000):
        await decide(h, runtime, amount)
    await checkpoint(h, auditor)
    return auditor, await _forms(h, tenant)


@pytest.mark.parametrize("lean", [event_row.V4_PAIR, event_row.V6_SINGLE, event_row.V5_TAIL])
async def test_a_row_deleted_by_hand_is_reported_deleted_by_the_verifier(
        harness: Harness, tenant: str, lean: int) -> None:
    auditor, forms = await _seed(harness, tenant)
    # a row whose next row leans on it (the next is a head, a single or a tail)
    gone = next(s for s in sorted(forms) if s > 1 and forms.get(s + 1) == lean)
    await _delete(harness, tenant, audit_events.c.seq == gone)
    lines = await export_lines(harness, auditor)
    report = verify_export(lambda: iter(lines), await jwks(harness))
    assert (report.ok, report.fault, report.bad_seq) == (False, "deleted", gone), report


async def test_the_first_rows_deleted_by_hand(harness: Harness, tenant: str) -> None:
    """``DELETE ... WHERE seq <= k`` instead of a prune: the export is still produced
    (anchored at the checkpoint at ``k``, when there is one) and does not verify."""
    auditor, forms = await _seed(harness, tenant)
    first = min(s for s in forms if s > 2 and forms[s] in (event_row.V4_PAIR,
                                                            event_row.V6_SINGLE))
    await _delete(harness, tenant, audit_events.c.seq < first)
    lines = await export_lines(harness, auditor)
    report = verify_export(lambda: iter(lines), await jwks(harness))
    assert not report.ok and report.fault == "bad_anchor", report


async def test_the_event_after_a_newest_row_deleted_by_hand_reads(harness: Harness,
                                                                   tenant: str) -> None:
    """The newest row deleted by hand: the next decision's first event finds no row to
    lean on (its ``prev_hash`` is the deleted row's hash) and keeps it in its own row, so
    it reads, and the export reports the deleted row alone."""
    runtime = await harness.headers(tenant, "runtime")
    auditor, forms = await _seed(harness, tenant)
    gone = max(forms)
    await _delete(harness, tenant, audit_events.c.seq == gone)
    await decide(harness, runtime, 5000)
    ev = audit_events.c
    async with harness.db.read() as conn:
        rows = (await conn.execute(select(ev.seq, ev.body, ev.hash).where(
            ev.tenant == tenant, ev.seq > gone).order_by(ev.seq))).all()
    assert [int(r.seq) for r in rows] == [gone + 1, gone + 2]
    assert [hash_bytes(r.body.encode()) for r in rows] == [r.hash for r in rows]
    lines = await export_lines(harness, auditor)
    report = verify_export(lambda: iter(lines), await jwks(harness))
    assert (report.ok, report.fault, report.bad_seq) == (False, "deleted", gone), report


async def test_events_api_leaves_out_what_no_longer_reads(harness: Harness,
                                                          tenant: str) -> None:
    """GET /v1/audit/events with the head of a pair deleted by hand: the page answers
    (not a 500), the deleted row and its tail (whose text was in it) are both missing
    from it as a gap in seq, every other event is there."""
    runtime = await harness.headers(tenant, "runtime")
    auditor = await harness.headers(tenant, "auditor")
    for _ in range(3):
        await decide(harness, runtime)
    ev = audit_events.c
    async with harness.db.read() as conn:
        forms = dict((await conn.execute(select(ev.seq, type_coerce(ev.body, RawBlob)).where(
            ev.tenant == tenant))).all())
    head = next(s for s in sorted(forms) if s > 1 and bytes(forms[s])[0] == 4)
    async with harness.db.transaction() as conn:
        await conn.execute(audit_events.delete().where(ev.tenant == tenant, ev.seq == head))
    resp = await harness.client.get("/v1/audit/events", headers=auditor)
    assert resp.status_code == 200, resp.text
    seqs = [e["seq"] for e in resp.json()["events"]]
    assert seqs == [s for s in sorted(forms) if s not in (head, head + 1)]
