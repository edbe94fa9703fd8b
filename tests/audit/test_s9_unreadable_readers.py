"""Every decision-log reader of the audit area with an event that does not read (its row
before deleted by hand, its frame damaged, its text garbled: tests/audit/damage.py): no
500, no crash; the event is left out (logged) and the rest is there. Session 9."""

from __future__ import annotations

import asyncio
import csv
import io
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from cosigner.audit import system
from cosigner.audit.prune import prune
from cosigner.audit.verify import verify_export
from cosigner.cli.main import main as cli_main
from cosigner.core.clock import FrozenClock
from cosigner.db import event_row
from cosigner.db.tables import audit_events
from tests.audit.conftest import decide, export_lines, jwks, old_and_new
from tests.audit.damage import KINDS, damage, seqs, stored
from tests.conftest import Harness

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
ACTOR = {"subject": "test", "principal_id": None, "kind": "cli"}


async def _seed(h: Harness, tenant: str) -> tuple[dict[str, str], int]:
    """Six decisions; the auditor's headers and a ``decision.made`` event past the first
    decisions stored as the head of a pair (so that every kind of damage applies)."""
    runtime = await h.headers(tenant, "runtime")
    for amount in (5000, 150000, 250000, 5000, 250000, 5000):
        await decide(h, runtime, amount)
    rows = await stored(h, tenant)
    made = await seqs(h, tenant, "decision.made")
    target = next(s for s in made if s > 3 and rows[s][0] == event_row.V4_PAIR)
    return await h.headers(tenant, "auditor"), target


@pytest.mark.parametrize("kind", KINDS)
async def test_events_api_and_search_leave_out_what_does_not_read(
        harness: Harness, tenant: str, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    auditor, target = await _seed(harness, tenant)
    every = sorted(await stored(harness, tenant))
    made = await seqs(harness, tenant, "decision.made")
    hit = await damage(harness, tenant, target, kind)
    with caplog.at_level(logging.WARNING, logger="cosigner.audit"):
        resp = await harness.client.get("/v1/audit/events", headers=auditor)
    assert resp.status_code == 200, resp.text
    assert [e["seq"] for e in resp.json()["events"]] == [s for s in every if s not in hit]
    assert f"{tenant}/{target} does not read" in caplog.text
    # search by type, and paged one event at a time across the damaged one
    resp = await harness.client.get("/v1/audit/events", headers=auditor,
                                    params={"type": "decision.made"})
    assert resp.status_code == 200, resp.text
    assert [e["seq"] for e in resp.json()["events"]] == [s for s in made if s not in hit]
    got, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 1, **({"cursor": cursor} if cursor else {})}
        resp = await harness.client.get("/v1/audit/events", headers=auditor, params=params)
        assert resp.status_code == 200, resp.text
        got += [e["seq"] for e in resp.json()["events"]]
        cursor = resp.json().get("next_cursor")
        if not cursor:
            break
    assert got == [s for s in every if s not in hit]


@pytest.mark.parametrize("kind", KINDS)
async def test_exports_leave_out_what_does_not_read(harness: Harness, tenant: str,
                                                    kind: str) -> None:
    auditor, target = await _seed(harness, tenant)
    every = sorted(await stored(harness, tenant))
    hit = await damage(harness, tenant, target, kind)
    resp = await harness.client.get("/v1/audit/export", headers=auditor,
                                    params={"format": "csv"})
    assert resp.status_code == 200, resp.text
    rows = list(csv.DictReader(io.StringIO(resp.text)))
    assert [int(r["seq"]) for r in rows] == [s for s in every if s not in hit]
    lines = await export_lines(harness, auditor)
    report = verify_export(lambda: iter(lines), await jwks(harness))
    assert not report.ok
    if kind != "text_garbled":  # a text that decodes goes out as it is (the verifier
        # refuses the line); one that does not is left out, a gap the verifier names
        assert (report.fault, report.bad_seq) == ("deleted", min(hit)), report


async def test_cli_csv_export_leaves_out_what_does_not_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tenant: str, harness: Harness,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`cosigner audit export --format csv` with a garbled event: exit 0, every other
    event written."""
    _, target = await _seed(harness, tenant)
    every = sorted(await stored(harness, tenant))
    hit = await damage(harness, tenant, target, "text_garbled")
    monkeypatch.setenv("COSIGNER_DATABASE_URL", harness.settings.database_url)
    out = tmp_path / "log.csv"
    code = await asyncio.to_thread(cli_main, ["audit", "export", "--tenant", tenant,
                                              "--format", "csv", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [int(r["seq"]) for r in rows] == [s for s in every if s not in hit]


@pytest.mark.parametrize("kind", ["row_before_deleted", "frame_damaged"])
async def test_prune_goes_on_past_a_first_kept_event_that_does_not_read(
        harness_factory: Any, tenant: str, kind: str) -> None:
    clock = FrozenClock(T0)
    h: Harness = await harness_factory(clock=clock)
    auditor = await h.headers(tenant, "auditor")
    old = await old_and_new(h, tenant, clock)
    first = old["seq"] + 1
    hit = await damage(h, tenant, first, kind)
    result = await prune(h.db, tenant=tenant, before=T0.replace(day=20), now=clock(),
                         actor=ACTOR)
    assert result.anchor_seq == old["seq"]
    async with h.db.read() as conn:
        low = (await conn.execute(select(func.min(audit_events.c.seq)).where(
            audit_events.c.tenant == tenant))).scalar()
    assert low == first  # kept as stored: not rewritten, not deleted
    lines = await export_lines(h, auditor)
    report = verify_export(lambda: iter(lines), await jwks(h))
    assert (report.ok, report.fault, report.bad_seq) == (False, "deleted", first), (
        report, hit)


@pytest.mark.parametrize("kind", ["frame_damaged", "text_garbled"])
async def test_recording_the_keyring_goes_on_past_a_key_event_that_does_not_read(
        harness: Harness, tenant: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The keyring record (server start) in a chain of its own (this test's tenant
    instead of the shared ``_system``): a key whose ``key.created`` does not read is
    recorded again; the others are not."""
    monkeypatch.setattr(system, "SYSTEM_TENANT", tenant)
    keyring = harness.context.keyring
    keys = len(list(keyring.keys()))
    assert await system.record_keyring(harness.db, keyring, now=T0) == keys
    assert await system.record_keyring(harness.db, keyring, now=T0) == 0
    created = await seqs(harness, tenant, "key.created")
    await damage(harness, tenant, created[0], kind)
    assert await system.record_keyring(harness.db, keyring, now=T0) == 1
    assert len(await seqs(harness, tenant, "key.created")) == keys + 1
