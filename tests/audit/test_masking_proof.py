"""A masked value appears nowhere: not in the database file, the API, or the export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.audit.masking import MASK
from cosigner.db.tables import audit_events
from tests.audit.conftest import export_lines, records
from tests.conftest import decision_request

SECRETS = {
    "catalogue": "4111-1111-SECRET-CARD",
    "policy": "NOTE-SECRET-POLICY-MASK",
    "always": "sk-live-SECRET-API-KEY",
    "context": "Bearer CTX-SECRET-TOKEN",
}

RULES = '''
def decide(input):
    return {"effect": "allow", "reasons": [{"code": "ok", "message": "ok"}],
            "mask": ["/note"]}
'''
TOOLS = '''
tools:
  charge_card:
    side_effect: financial
    mask: ["/card_number"]
    schema:
      type: object
      properties:
        card_number: {type: string}
        note: {type: string}
        api_key: {type: string}
        amount_minor: {type: integer}
      required: [card_number]
      additionalProperties: false
'''


def masking_bundle(root: Path) -> Path:
    folder = root / "bundles" / "masking"
    folder.mkdir(parents=True)
    (folder / "manifest.toml").write_text(
        'id = "masking"\nversion = "1"\nengine = "python"\nentrypoint = "decide"\n'
        'tenants = ["*"]\ncatalogue = "tools.yaml"\n')
    (folder / "rules.py").write_text(RULES)
    (folder / "tools.yaml").write_text(TOOLS)
    return folder.parent


def assert_clean(where: str, text: str) -> None:
    for name, secret in SECRETS.items():
        assert secret not in text, f"{name} secret leaked into {where}"
        assert secret.split()[-1] not in text, f"{name} secret leaked into {where}"


async def decide_with_secrets(harness_factory: Any, tmp_path: Path, tenant: str) -> Any:
    h = await harness_factory(bundle_dirs=[masking_bundle(tmp_path)])
    runtime = await h.headers(tenant, "runtime")
    body = decision_request(
        tool={"name": "charge_card"},
        args={"card_number": SECRETS["catalogue"], "note": SECRETS["policy"],
              "api_key": SECRETS["always"], "amount_minor": 100},
        context={"Authorization": SECRETS["context"], "region": "eu"})
    resp = await h.client.post("/v1/decisions", headers=runtime, json=body)
    assert resp.status_code == 200 and resp.json()["effect"] == "allow", resp.text
    return h


async def test_masked_values_never_reach_the_log_api_or_export(harness_factory: Any,
                                                               tmp_path: Path,
                                                               tenant: str) -> None:
    h = await decide_with_secrets(harness_factory, tmp_path, tenant)
    async with h.db.read() as conn:
        stored = (await conn.execute(select(audit_events.c.body).where(
            audit_events.c.tenant == tenant))).scalars().all()
    assert_clean("the stored events", "".join(stored))
    # Every table read back decoded, value by value: compressed columns
    # (cosigner.db.compressed) would hide a leak from a search of the file's bytes.
    for name, secret in SECRETS.items():
        holders = await tables_holding(h, secret.split()[-1], tenant)
        assert not holders, f"masked value {name} is stored in {sorted(holders)}"
    auditor = await h.headers(tenant, "auditor")
    events = (await h.client.get("/v1/audit/events", headers=auditor,
                                 params={"type": "decision.made"})).json()["events"]
    payload = events[0]["payload"]
    assert payload["args"] == {"card_number": MASK, "note": MASK, "api_key": MASK,
                               "amount_minor": 100}
    assert payload["context"] == {"Authorization": MASK, "region": "eu"}
    assert payload["masked_paths"] == ["/args/api_key", "/args/card_number", "/args/note",
                                       "/context/Authorization"]
    assert_clean("the query API", (await h.client.get("/v1/audit/events",
                                                      headers=auditor)).text)
    lines = await export_lines(h, auditor)
    assert_clean("the JSON Lines export", "".join(lines))
    assert any(r.get("body", {}).get("type") == "decision.made" for r in records(lines))
    csv_text = (await h.client.get("/v1/audit/export", headers=auditor,
                                   params={"format": "csv"})).text
    assert_clean("the CSV export", csv_text)


async def tables_holding(h: Any, needle: str, tenant: str | None = None) -> set[str]:
    """Names of the tables where some row's text (of ``tenant`` where a table has a
    tenant column) contains ``needle``."""
    import importlib
    import pkgutil

    import cosigner.db
    from cosigner.db import response_row
    from cosigner.db.tables import metadata

    for info in pkgutil.iter_modules(cosigner.db.__path__):
        if info.name.startswith("tables_"):
            importlib.import_module(f"cosigner.db.{info.name}")
    found = set()
    async with h.db.read() as conn:
        for table in metadata.sorted_tables:
            query = select(table)
            if tenant is not None and "tenant" in table.c:
                query = query.where(table.c.tenant == tenant)
            rows = (await conn.execute(query)).all()
            if table.name == "decisions":  # stored form 3 is read with its row (0022)
                rows = [(*row, response_row.answer(row)) for row in rows]
            if any(needle in str(tuple(row)) for row in rows):
                found.add(table.name)
    return found


async def test_masked_values_never_reach_the_sqlite_file(harness_factory: Any, tmp_path: Path,
                                                         tenant: str, db_kind: str) -> None:
    if db_kind != "sqlite":
        pytest.skip("reads the raw SQLite file")
    h = await decide_with_secrets(harness_factory, tmp_path, tenant)
    db_path = Path(h.settings.database_url.split(":///", 1)[1])
    raw = b"".join(p.read_bytes() for p in db_path.parent.glob(db_path.name + "*"))
    assert b"SQLite format 3" in raw
    leaks = {name: secret.split()[-1] for name, secret in SECRETS.items()
             if secret.split()[-1].encode() in raw}
    if leaks:  # name the tables that hold them, to say whose storage leaks
        holders = set().union(*[await tables_holding(h, s) for s in leaks.values()])
        raise AssertionError(f"masked values {sorted(leaks)} are in the SQLite file "
                             f"(tables {sorted(holders)})")
