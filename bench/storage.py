"""What the decision log costs on disk, and a seeded log for the throughput cells.

``seed``: N ``allow`` decisions through the real decide path
(:func:`cosigner.decisions.pdp.decide`, the function the route calls, group commit and
all), in process, ``--chunk`` concurrent decisions at a time so the committer writes
large batches. Each request is the call ``bench/lua/decide.lua`` sends (issue_refund
5000, one run per 1,000 calls), by the principal that ``cosigner principals add-key``
made for the tenant, or a seed principal; order, amount (≤ 100000, so ``allow``) and
customer differ from call to call. ``report``: a WAL checkpoint (TRUNCATE), then
the bytes of every table and index from SQLite's ``dbstat`` (pages × page size, and the
payload bytes), divided by the number of allow decisions::

    .venv/bin/python bench/storage.py --decisions 20000               # fresh temp file
    .venv/bin/python bench/storage.py --decisions 1000000 --database var/bench/seeded.db
    .venv/bin/python bench/storage.py --report-only --database var/bench/seeded.db

The bench system ``allow-py-1m`` (bench/systems.py) seeds its database with this
module before its cells (``BENCH_SEED_DECISIONS``, default 1,000,000).
The compression dictionary (:mod:`cosigner.db.zdict_v1`) was made from the bench's own
call, so these varied calls are what its figures should be read from.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: One run id per this many calls (decide.lua: one run per wrk thread).
RUN_LENGTH = 1000


def body(tag: str, i: int) -> dict[str, Any]:
    """The DecisionRequest v1 that decide.lua sends (allow mode), with an order id,
    amount and customer of its own (so no two calls share an args hash: compression is
    not flattered by repeated values)."""
    return {"request_id": f"req-{tag}-{i}", "run": {"id": f"run-{tag}-{i // RUN_LENGTH}",
                                                    "step": i % RUN_LENGTH + 1},
            "principal": {"id": f"customer-{i * 7919 % 1_000_003}", "type": "customer"},
            "initiator": {"id": "agent-support", "type": "agent"},
            "tool": {"name": "issue_refund", "side_effect": "financial"},
            "args": {"order_id": f"ord_{i}", "amount_minor": 100 + i * 7919 % 99_000,
                     "currency": "USD", "reason_code": "duplicate_charge"},
            "context": {}}


async def seed(url: str, tenant: str, n: int, *, chunk: int, key_dir: Path,
               quiet: bool = False) -> tuple[float, float]:
    """``n`` allow decisions for ``tenant`` through decide(); returns the seconds taken
    (wall, and this process's CPU)."""
    from cosigner.app import create_app
    from cosigner.core.settings import Settings
    from cosigner.decisions.pdp import DecisionRequest, decide
    from cosigner.identity.principals import Caller

    settings = Settings(database_url=url, bundle_dirs=[ROOT / "policies"], key_dir=key_dir,
                        log_level="warning", permit_ttl_s=86400, log_batch_max=chunk,
                        log_queue_max=max(10_000, 2 * chunk),
                        log_queue_per_tenant_max=max(10_000, 2 * chunk))
    app = create_app(settings)
    principal = _principal(url, tenant)
    caller = Caller(tenant=tenant, principal_id=principal, subject="bench-runtime",
                    roles=frozenset({"runtime"}), kind="key")
    tag = f"seed{os.getpid()}x{int(time.time())}"
    async with app.router.lifespan_context(app):
        started, cpu = time.perf_counter(), time.process_time()
        ctx = app.state.context
        done = 0
        while done < n:
            reqs = []
            for i in range(done, min(n, done + chunk)):
                raw = body(tag, i)
                reqs.append(DecisionRequest(
                    request_id=raw["request_id"], run=raw["run"], principal=raw["principal"],
                    initiator=raw["initiator"], tool=raw["tool"], args=raw["args"],
                    context=raw["context"], raw=raw))
            answers = await asyncio.gather(*(decide(ctx, caller, r) for r in reqs))
            if any(a["effect"] != "allow" for a in answers):
                raise SystemExit("seed: a decision was not allow")
            done += len(reqs)
            if not quiet and (done % 50_000 < chunk or done == n):
                took = time.perf_counter() - started
                print(f"  seeded {done:>9,} in {took:6.0f} s ({done / took:,.0f}/s)",
                      flush=True)
        return time.perf_counter() - started, time.process_time() - cpu


def _principal(url: str, tenant: str) -> str:
    """The id of the tenant's bench runtime principal when it exists, else a seed id."""
    path = url.split("///", 1)[1]
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT id FROM principals WHERE tenant = ? AND subject = ?",
                         (tenant, "bench-runtime")).fetchone()
    return row[0] if row else "00000000-0000-7000-8000-000000000000"


def report(path: Path) -> dict[str, Any]:
    """Checkpoint the WAL, then bytes per table/index and per allow decision."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    allows = db.execute("SELECT count(*) FROM decisions WHERE effect = 'allow'").fetchone()[0]
    page = db.execute("PRAGMA page_size").fetchone()[0]
    rows = db.execute(
        "SELECT d.name, m.type, m.tbl_name, count(*), sum(d.payload), sum(d.unused)"
        " FROM dbstat d JOIN sqlite_master m ON m.name = d.name"
        " GROUP BY d.name ORDER BY count(*) DESC").fetchall()
    file_bytes = path.stat().st_size
    db.close()
    out: dict[str, Any] = {"allow_decisions": allows, "file_bytes": file_bytes,
                           "page_size": page, "objects": []}
    for name, kind, table, pages, payload, unused in rows:
        out["objects"].append({"name": name, "kind": kind, "table": table,
                               "bytes": pages * page, "payload": payload or 0,
                               "unused": unused or 0})
    return out


def print_report(rep: dict[str, Any]) -> None:
    n = max(1, rep["allow_decisions"])
    print(f"allow decisions: {rep['allow_decisions']:,}; file {rep['file_bytes']:,} B "
          f"= {rep['file_bytes'] / n:,.0f} B per allow decision (after a WAL checkpoint)")
    print("| object | kind | table | bytes per decision | payload per decision |")
    print("|---|---|---|---:|---:|")
    tables: dict[str, float] = {}
    indexes = 0.0
    for obj in rep["objects"]:
        per = obj["bytes"] / n
        if per < 1:
            continue
        tables[obj["table"]] = tables.get(obj["table"], 0.0) + per
        if obj["kind"] == "index":
            indexes += per
        print(f"| {obj['name']} | {obj['kind']} | {obj['table']} | {per:,.0f} | "
              f"{obj['payload'] / n:,.0f} |")
    print("per table (indexes included): " + ", ".join(
        f"{t} {b:,.0f}" for t, b in sorted(tables.items(), key=lambda kv: -kv[1])))
    print(f"indexes: {indexes:,.0f} B per decision")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--database", type=Path, default=None,
                        help="SQLite file (migrated when new); default: a temp file")
    parser.add_argument("--tenant", default="bench")
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--key-dir", type=Path, default=None)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.database or Path(tmp) / "cosigner.db"
        url = f"sqlite+aiosqlite:///{path}"
        if not args.report_only:
            from cosigner.db.migrate import upgrade

            asyncio.run(upgrade(url))
            took, cpu = asyncio.run(seed(url, args.tenant, args.decisions,
                                         chunk=args.chunk,
                                         key_dir=args.key_dir or Path(tmp) / "keys"))
            print(f"seeded {args.decisions:,} decisions in {took:.0f} s "
                  f"({args.decisions / took:,.0f}/s), "
                  f"{cpu / args.decisions * 1e6:,.0f} µs CPU per decision (in process)")
        print_report(report(path))


if __name__ == "__main__":
    main()
