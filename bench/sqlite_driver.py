"""What one SQLAlchemy statement costs on SQLite: aiosqlite's thread per call vs
:mod:`cosigner.db.sqlite_inline` (statements on the loop thread, COMMIT on the thread).

    .venv/bin/python bench/sqlite_driver.py [--statements 2000] [--transactions 300] [--rounds 3]

Both engines open the same WAL file with the server's PRAGMAs (``Database``'s
``_configure_sqlite``); rounds alternate the two (A B A B …) so machine drift hits both.
Prints wall and CPU µs per ``SELECT 1`` on an open connection and per write transaction
(``BEGIN IMMEDIATE``, one ``INSERT``, ``COMMIT`` with ``synchronous=FULL``), and the
ratios. CPU is the whole process (loop thread + worker threads).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine  # noqa: E402

from cosigner.db.database import _configure_sqlite  # noqa: E402
from cosigner.db.sqlite_inline import inline_creator  # noqa: E402

BUSY_MS = 10_000


async def _statements(engine: AsyncEngine, n: int) -> tuple[float, float]:
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            await conn.execute(text("SELECT 1"))
        return ((time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6)


async def _transactions(engine: AsyncEngine, n: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO t (a) VALUES (:a)"), {"a": i})
    return ((time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statements", type=int, default=2000)
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = Path(tempfile.mkdtemp()) / "driver.db"
    url = f"sqlite+aiosqlite:///{path}"
    engines: dict[str, AsyncEngine] = {
        "aiosqlite thread": create_async_engine(url, connect_args={"timeout": BUSY_MS / 1000}),
        "inline": create_async_engine(url, async_creator=inline_creator(
            str(path), busy_timeout_ms=BUSY_MS)),
    }
    for engine in engines.values():
        _configure_sqlite(engine, BUSY_MS)
    async with engines["inline"].begin() as conn:
        await conn.execute(text("CREATE TABLE t (a INTEGER)"))
    results: dict[str, dict[str, list[float]]] = {
        name: {"stmt_wall": [], "stmt_cpu": [], "tx_wall": [], "tx_cpu": []}
        for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            wall, cpu = await _statements(engine, args.statements)
            results[name]["stmt_wall"].append(wall)
            results[name]["stmt_cpu"].append(cpu)
            wall, cpu = await _transactions(engine, args.transactions)
            results[name]["tx_wall"].append(wall)
            results[name]["tx_cpu"].append(cpu)
    med: dict[str, dict[str, Any]] = {
        name: {k: statistics.median(v) for k, v in r.items()} for name, r in results.items()}
    print(f"median of {args.rounds} interleaved rounds, µs per operation")
    print(f"{'engine':18} {'SELECT wall':>12} {'SELECT CPU':>11} {'tx wall':>9} {'tx CPU':>8}")
    for name, m in med.items():
        print(f"{name:18} {m['stmt_wall']:12.0f} {m['stmt_cpu']:11.0f} "
              f"{m['tx_wall']:9.0f} {m['tx_cpu']:8.0f}")
    a, b = med["aiosqlite thread"], med["inline"]
    print(f"inline / thread: SELECT CPU {b['stmt_cpu'] / a['stmt_cpu']:.2f}×, "
          f"write transaction CPU {b['tx_cpu'] / a['tx_cpu']:.2f}×")
    for engine in engines.values():
        await engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
