"""Periodic signed checkpoints, retention up to a checkpoint, system events, the CLI."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from cosigner.audit.prune import prune
from cosigner.audit.verify import verify_export
from cosigner.cli import main as cli
from cosigner.core.clock import FrozenClock
from cosigner.core.roles import SYSTEM_TENANT
from cosigner.db.tables import audit_events
from tests.audit.conftest import (
    checkpoint,
    decide,
    export_lines,
    jwks,
    old_and_new,
    records,
)
from tests.conftest import Harness

T0 = datetime(2030, 1, 1, tzinfo=UTC)


async def test_checkpoint_every_n_events(harness_factory: Any, tenant: str) -> None:
    h: Harness = await harness_factory(checkpoint_every_events=4, checkpoint_every_s=3600)
    runtime = await h.headers(tenant, "runtime")  # 1 event
    checkpointer = h.tasks.checkpointer
    await decide(h, runtime, 250000)  # deny: 1 event (2 so far)
    assert tenant not in [c.tenant for c in await checkpointer.run_once()]
    await decide(h, runtime, 5000)  # allow: decision + permit (4 so far)
    signed = [c for c in await checkpointer.run_once() if c.tenant == tenant]
    assert [c.seq for c in signed] == [4]


async def test_checkpoint_after_t_seconds(harness_factory: Any, tenant: str) -> None:
    clock = FrozenClock(T0)
    h: Harness = await harness_factory(clock=clock, checkpoint_every_events=1000,
                                       checkpoint_every_s=60)
    runtime = await h.headers(tenant, "runtime")
    await decide(h, runtime, 250000)
    checkpointer = h.tasks.checkpointer
    clock.advance(seconds=59)
    assert tenant not in [c.tenant for c in await checkpointer.run_once()]
    clock.advance(seconds=1)
    assert [c.seq for c in await checkpointer.run_once() if c.tenant == tenant] == [2]


async def test_prune_keeps_the_log_verifiable(harness_factory: Any, tenant: str) -> None:
    clock = FrozenClock(T0)
    h: Harness = await harness_factory(clock=clock)
    auditor = await h.headers(tenant, "auditor")
    old = await old_and_new(h, tenant, clock)
    await checkpoint(h, auditor)
    result = await prune(h.db, tenant=tenant, before=T0.replace(day=20), now=clock(),
                         actor={"subject": "test", "principal_id": None, "kind": "cli"})
    assert (result.anchor_seq, result.anchor_hash) == (old["seq"], old["hash"])
    assert result.deleted == old["seq"]
    async with h.db.read() as conn:
        low = (await conn.execute(select(func.min(audit_events.c.seq))
                                  .where(audit_events.c.tenant == tenant))).scalar()
    assert low == old["seq"] + 1
    lines = await export_lines(h, auditor)
    header = records(lines)[0]
    assert header["anchor"] == {"seq": old["seq"], "hash": old["hash"]}
    report = verify_export(lambda: iter(lines), await jwks(h))
    assert report.ok, report
    assert records(lines)[-2]["body"]["type"] == "audit.pruned"


async def test_prune_without_an_old_checkpoint_deletes_nothing(harness: Harness,
                                                               tenant: str) -> None:
    await decide(harness, await harness.headers(tenant, "runtime"))
    result = await prune(harness.db, tenant=tenant, before=datetime(2000, 1, 1, tzinfo=UTC),
                         now=T0, actor={"subject": "t", "principal_id": None, "kind": "cli"})
    assert (result.anchor_seq, result.deleted) == (None, 0)


async def test_startup_records_policy_and_key_events(harness: Harness) -> None:
    async with harness.db.read() as conn:
        rows = (await conn.execute(select(audit_events.c.type, audit_events.c.body).where(
            audit_events.c.tenant == SYSTEM_TENANT))).all()
    kid = harness.context.keyring.current_kid
    kinds = {r.type for r in rows}
    assert {"key.created", "policy.loaded", "policy.activated"} <= kinds
    assert any(json.loads(r.body)["payload"].get("kid") == kid for r in rows
               if r.type == "key.created")


def test_cli_export_then_verify_offline(tmp_path: Path, monkeypatch: Any, tenant: str,
                                        settings_factory: Any, capsys: Any) -> None:
    """`cosigner audit export` writes what `cosigner audit verify` accepts; a tampered
    copy exits 1 naming the fault."""
    import asyncio

    from cosigner.app import create_app

    settings = settings_factory()
    monkeypatch.setenv("COSIGNER_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("COSIGNER_KEY_DIR", str(settings.key_dir))

    async def seed() -> dict[str, Any]:
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            import httpx

            h = Harness(app, httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                               base_url="http://t"), settings)
            runtime = await h.headers(tenant, "runtime")
            for amount in (5000, 250000, 150000):
                await decide(h, runtime, amount)
            keys = await jwks(h)
            await h.client.aclose()
            return keys

    keys = asyncio.run(seed())
    jwks_file = tmp_path / "jwks.json"
    jwks_file.write_text(json.dumps(keys))
    out = tmp_path / "export.jsonl"
    assert cli.main(["audit", "export", "--tenant", tenant, "--out", str(out)]) == 0
    assert cli.main(["audit", "verify", str(out), "--jwks", str(jwks_file)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    lines = out.read_text().splitlines(keepends=True)
    del lines[2]
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(lines))
    assert cli.main(["audit", "verify", str(tampered), "--jwks", str(jwks_file),
                     "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["fault"], report["bad_seq"]) == ("deleted", 2)  # line 2 held seq 2
    assert cli.main(["audit", "prune", "--tenant", tenant, "--before", "2999-01-01"]) == 0
    assert "pruned" in capsys.readouterr().out
    again = tmp_path / "after-prune.jsonl"
    assert cli.main(["audit", "export", "--tenant", tenant, "--out", str(again)]) == 0
    assert cli.main(["audit", "verify", str(again), "--jwks", str(jwks_file)]) == 0
