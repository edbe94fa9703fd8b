"""Two processes' decision batches on one tenant's chain, PostgreSQL, without HTTP.

Each process runs the real decision group committer (``decision_log_writer``: the raw
asyncpg batch, guard, rows, chain head) and ``--inflight`` concurrent submitters of
prepared allow writes (a decision row, a permit row and two events, as an allow writes);
commits per second, batch sizes, process and postgres CPU are printed. (Session 5 also
compared an ``early`` variant — the head lock released at an asynchronous COMMIT, then a
synchronous flush — which was not kept: see :mod:`cosigner.db.raw_pg`.)

    .venv/bin/python bench/pg_chain.py [--seconds 5] [--inflight 8 32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.servers import pg_admin, pg_cpu, pg_cpu_delta  # noqa: E402


def _worker(url: str, variant: str, inflight: int, seconds: float, ready: object,
            out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    from cosigner.audit.chain import Event
    from cosigner.core.settings import Settings
    from cosigner.db.batch import Write
    from cosigner.db.database import Database
    from cosigner.db.tables import decisions, permits
    from cosigner.decisions.pdp import decision_log_writer
    from cosigner.decisions.plan import Assumed

    def write(tag: str) -> Write:
        now = datetime.now(UTC)
        did = str(uuid.uuid4())
        actor = {"kind": "key", "subject": "bench"}
        return Write("bench", [
            Event(type="decision.made", actor=actor, decision_id=did, run_id="run",
                  tool="issue_refund", effect="allow", payload={"args": {"a": 1}}, time=now),
            Event(type="permit.minted", actor=actor, decision_id=did, permit_jti=did,
                  run_id="run", tool="issue_refund", payload={"ttl_s": 300}, time=now)],
            did, [(decisions, {
                "id": did, "tenant": "bench", "request_id": tag + did,
                "request_hash": "sha256:" + "0" * 64, "run_id": "run", "tool": "issue_refund",
                "args_hash": "sha256:" + "1" * 64, "effect": "allow", "caller": "bench",
                "policy_id": "refunds", "policy_version": "1", "policy_revision": None,
                "response": {"decision_id": did, "effect": "allow"}, "created_at": now}),
                  (permits, {"jti": did, "tenant": "bench", "decision_id": did,
                             "approval_id": None, "run_id": "run", "tool": "issue_refund",
                             "args_hash": "sha256:" + "1" * 64, "status": "issued",
                             "issued_at": now, "expires_at": now})],
            assumes=Assumed(run=("bench", "run"),
                            call=("bench", "run", "issue_refund", "sha256:" + "1" * 64),
                            request=("bench", tag + did)))

    async def main() -> None:
        db = Database(url)
        writer = decision_log_writer(db, Settings(database_url=url))
        writer.start()
        done = 0

        async def submitter(i: int) -> None:
            nonlocal done
            while time.monotonic() < start + seconds:
                await writer.submit(write(f"{os.getpid()}-{i}-"), key="bench")
                done += 1

        await writer.submit(write("warm-"), key="bench")  # connected, statements known
        await asyncio.to_thread(ready.wait)  # type: ignore[attr-defined]
        start = time.monotonic()
        cpu0 = time.process_time()
        await asyncio.gather(*(submitter(i) for i in range(inflight)))
        out.put((done, time.process_time() - cpu0, writer.stats.batches))
        await asyncio.to_thread(ready.wait)  # type: ignore[attr-defined]  # pg CPU read
        await writer.stop()
        await db.dispose()

    asyncio.run(main())


def measure(url: str, name: str, variant: str, inflight: int, seconds: float
            ) -> tuple[float, float, float, float]:
    """``(commits/s, process CPU µs per commit, postgres CPU µs per commit, mean batch)``."""
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    ready = multiprocessing.Barrier(3)
    procs = [multiprocessing.Process(target=_worker, args=(
        url, variant, inflight // 2, seconds, ready, out)) for _ in range(2)]
    for p in procs:
        p.start()
    ready.wait(timeout=120)
    pg0 = pg_cpu(name)
    results = [out.get(timeout=seconds + 60) for _ in procs]
    pg = pg_cpu_delta(pg0, pg_cpu(name))
    ready.wait(timeout=60)
    for p in procs:
        p.join()
    n = sum(r[0] for r in results)
    return (n / seconds, sum(r[1] for r in results) / n * 1e6, pg / n * 1e6,
            n / max(1, sum(r[2] for r in results)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--inflight", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from cosigner.db.migrate import upgrade

    name = f"cosigner_bench_{os.getpid()}_pg_chain"
    pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    pg_admin(f'CREATE DATABASE "{name}"')
    url = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
    try:
        asyncio.run(upgrade(url))
        print("| variant | in flight | commits/s | process CPU µs/commit | postgres CPU "
              "µs/commit | mean batch |\n|---|---:|---:|---:|---:|---:|", flush=True)
        for _ in range(args.rounds):
            for inflight in args.inflight:
                for variant in ("sync",):
                    rate, cpu, pg, batch = measure(url, name, variant, inflight, args.seconds)
                    print(f"| {variant} | {inflight} | {rate:,.0f} | {cpu:,.0f} | {pg:,.0f} "
                          f"| {batch:.1f} |", flush=True)
    finally:
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
