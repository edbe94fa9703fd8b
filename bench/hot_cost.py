"""Server CPU per allow, redeem or ``require_approval`` decision, in process, without uvicorn.

The whole ASGI app (middlewares, the lean route, the use case, the group commit with its
COMMIT thread) serves synthetic requests from ``--c`` concurrent tasks; the figure is the
process's CPU time (user + system, every thread) per request. No load generator shares
the cores, so on a busy machine it is steadier than ``bench/run.py``'s server CPU, but it
leaves out the HTTP server (uvicorn + httptools: ~40–50 µs a request). The wall-clock
rate (requests per second of the round) and the mean decision-log batch are printed too:
at low ``--c`` they show waits (fsync, batch timers) that CPU time does not. Run it against
another checkout with ``--code DIR`` (e.g. a ``git archive`` of main) to compare::

    .venv/bin/python bench/hot_cost.py --system redeem [--n 1500] [--c 16] [--rounds 2]
    .venv/bin/python bench/hot_cost.py --system approval --code /tmp/main-archive

``allow``: amount 5000 on a new run per request (an allow with its permit).
``redeem``: before each round, ``--n`` permits are minted through the allow path (not
measured), then each is redeemed once. ``approval``: amount 150000 on a new run per
request, so each opens its own approval request. ``allow-rego``: ``allow`` on the tenant
that ``rego/refunds/manifest.toml`` maps to the embedded Rego bundle (what ``make bench``'s
``allow-rego`` measures), so the decision is the Rego engine's. Every request gives the
policy the same arguments (as ``decide.lua`` does); ``--distinct-args`` gives each its
own ``order_id``, so no input repeats (the Rego engine's result memo never answers).
``join``: amount 150000, one run per concurrent task (as ``decide.lua``'s ``join`` mode,
one per wrk thread), so each task's first request opens an approval request and every
later one joins it (``approval-join`` of ``bench/run.py``).

``--db sqlite`` (default): a fresh SQLite file per run. ``--db postgres``: a fresh
database ``cosigner_hot_<pid>`` on the PostgreSQL server of ``--pg`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``, a user that may create databases),
migrated, measured and dropped at the end (even after a failure). The figure is still the
serving process's CPU; the CPU of the database's PostgreSQL backends per request (read
from ``/proc``, so when the server runs on this machine; with ``--processes``, all
processes' backends over all processes' requests of the round) is printed after it::

    .venv/bin/python bench/hot_cost.py --system allow --db postgres --n 4000 --c 16

``--processes P`` (default 1): ``P`` serving processes on the one database (as
``allow-pg-2p`` runs two), each with its own ``--c`` tasks and ``--n`` requests a round,
each printing its own line; they share one key-encryption key and start each measured
round together (after every process's warm-up), so their batches meet on the database
(the chain head's row lock, PostgreSQL's commits).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ARGS = {"order_id": "ord_8472", "amount_minor": 5000, "currency": "USD",
        "reason_code": "duplicate_charge"}


def _decision(tag: str, amount: int, order_id: str = ARGS["order_id"],
              run: str | None = None) -> bytes:
    """A decision request ``req-<tag>`` in run ``run-<run>`` (default: ``run-<tag>``)."""
    return json.dumps({
        "request_id": "req-" + tag, "run": {"id": "run-" + (run or tag), "step": 1},
        "principal": {"id": "customer-42", "type": "customer"},
        "initiator": {"id": "agent-support", "type": "agent"},
        "tool": {"name": "issue_refund", "side_effect": "financial"},
        "args": dict(ARGS, amount_minor=amount, order_id=order_id), "context": {}},
        separators=(",", ":")).encode()


async def _measure(args: argparse.Namespace, url: str, keys: Path
                   ) -> list[tuple[float, float, float, float]]:
    from cosigner.app import create_app
    from cosigner.core.clock import system_clock
    from cosigner.core.settings import Settings
    from cosigner.db.database import Database
    from cosigner.identity.principals import create_api_key

    db = Database(url)
    root = Path(args.code)
    tenant = _rego_tenant(root) if args.system == "allow-rego" else "bench"
    key, _ = await create_api_key(db, tenant=tenant, roles=["runtime"],
                                  subject="bench-runtime", clock=system_clock)
    await db.dispose()
    app = create_app(Settings(database_url=url, key_dir=keys, log_level="warning",
                              bundle_dirs=[root / "policies"] if args.no_rego
                              else [root / "policies", root / "rego"],
                              permit_ttl_s=86400))
    auth = ("Bearer " + key).encode()
    # allow-rego: every answer must name the Rego bundle (a fallback would measure Python).
    want_policy = (b'"id":"' + _rego_id(root).encode() + b'"'
                   if args.system == "allow-rego" else b"")
    failures: list[bytes] = []

    async def one(path: str, body: bytes) -> bytes:
        scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1", "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 50000), "scheme": "http", "method": "POST",
            "root_path": "", "path": path, "raw_path": path.encode(), "query_string": b"",
            "headers": [(b"host", b"127.0.0.1:8000"), (b"authorization", auth),
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "state": {}, "app": None}
        given = False

        async def receive() -> dict[str, Any]:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        out: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            out.append(message)

        await app(scope, receive, send)
        if out[0]["status"] != 200 or (want_policy and want_policy not in out[1]["body"]):
            failures.append(out[1]["body"][:200])
        return bytes(out[1]["body"])

    results = []
    async with app.router.lifespan_context(app):
        for round_no in range(args.rounds + 1):  # round 0 warms up
            if round_no and args.barrier:
                await _meet(Path(args.barrier) / str(round_no), args.processes)
            n = args.n if round_no else 300
            tag = f"r{round_no}x{os.getpid()}"
            if args.system == "redeem":
                work = []
                for i in range(n):
                    made = json.loads(await one("/v1/decisions", _decision(f"{tag}-{i}", 5000)))
                    work.append(("/v1/permits/redeem", json.dumps({
                        "permit": made["permit"]["token"], "tool": "issue_refund",
                        "args": ARGS}).encode()))
            elif args.system == "join":
                # One run per worker (decide.lua's "join" mode, one per wrk thread): a
                # worker's first request opens the approval request, the rest join it.
                work = [("/v1/decisions", _decision(f"{tag}-{i}", 150_000,
                                                    run=f"{tag}-w{i % args.c}"))
                        for i in range(n)]
            else:
                amount = 150_000 if args.system == "approval" else 5000
                work = [("/v1/decisions", _decision(f"{tag}-{i}", amount, f"ord_{i}{tag}"
                                                    if args.distinct_args else ARGS["order_id"]))
                        for i in range(n)]
            shared = iter(work)
            queues = ([iter(work[w::args.c]) for w in range(args.c)]
                      if args.system == "join" else [shared] * args.c)

            async def worker(queue: Any) -> None:
                for path, body in queue:
                    await one(path, body)

            stats = app.state.context.log_writer.stats
            batches, items = stats.batches, stats.items
            backends = await _backends(url)
            server = _cpu_s(backends)
            started, wall = time.process_time(), time.perf_counter()
            await asyncio.gather(*(worker(queue) for queue in queues))
            if round_no:
                results.append(((time.process_time() - started) / n * 1e6,
                                n / (time.perf_counter() - wall),
                                (stats.items - items) / max(1, stats.batches - batches),
                                (_cpu_s(backends) - server) / (n * args.processes) * 1e6))
        if args.barrier:  # none leaves (closing its backends) while another still measures
            await _meet(Path(args.barrier) / "end", args.processes)
    if failures:
        sys.exit(f"{len(failures)} requests failed, e.g. {failures[0]!r}")
    return results


def _rego_manifest(root: Path) -> dict[str, Any]:
    import tomllib
    return tomllib.loads((root / "rego" / "refunds" / "manifest.toml").read_text())


def _rego_tenant(root: Path) -> str:
    """The tenant ``root``'s Rego refund bundle is mapped to (as bench/systems.py reads it)."""
    return next(t for t in _rego_manifest(root)["tenants"] if t != "*")


def _rego_id(root: Path) -> str:
    return str(_rego_manifest(root)["id"])


async def _backends(url: str) -> list[int]:
    """The process ids of the PostgreSQL backends serving ``url``'s database (none for
    SQLite, or when the server is not on this machine's ``/proc``)."""
    if not url.startswith("postgresql"):
        return []
    import asyncpg
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        pids = [row[0] for row in await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")]
    finally:
        await conn.close()
    return [pid for pid in pids if os.path.exists(f"/proc/{pid}/stat")]


def _cpu_s(pids: list[int]) -> float:
    """The CPU seconds (user + system) the processes ``pids`` have used so far."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


async def _meet(folder: Path, processes: int) -> None:
    """Wait until all ``processes`` have reached ``folder`` (a file each in it)."""
    folder.mkdir(exist_ok=True)
    (folder / str(os.getpid())).touch()
    while len(os.listdir(folder)) < processes:
        await asyncio.sleep(0.005)


async def _pg_admin(dsn: str, sql: str) -> None:
    """Run ``sql`` (CREATE/DROP DATABASE) on the maintenance database ``dsn``."""
    import asyncpg
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", choices=["allow", "allow-rego", "redeem", "approval",
                                             "join"],
                        default="redeem")
    parser.add_argument("--code", default=str(Path(__file__).resolve().parent.parent),
                        help="the checkout to measure (its cosigner package is imported)")
    parser.add_argument("--n", type=int, default=1500)
    parser.add_argument("--c", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--distinct-args", action="store_true",
                        help="allow/approval: a new order_id per request (no two requests "
                             "give the policy the same input)")
    parser.add_argument("--no-rego", action="store_true",
                        help="load the Python bundles only (regopy's allocator cannot start "
                             "under valgrind: bench/instructions.py)")
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres",
                        help="with --db postgres: the server (and maintenance database)")
    parser.add_argument("--processes", type=int, default=1,
                        help="serving processes on the one database")
    parser.add_argument("--url", help=argparse.SUPPRESS)  # a child: the migrated database
    parser.add_argument("--barrier", help=argparse.SUPPRESS)  # a child: where rounds meet
    args = parser.parse_args()
    if args.no_rego and args.system == "allow-rego":
        parser.error("--no-rego cannot measure allow-rego")
    sys.path.insert(0, args.code)
    os.environ["COSIGNER_RATE_LIMITS"] = json.dumps({"*": {
        "credential_per_s": 10**7, "credential_burst": 10**7, "tenant_per_s": 10**7,
        "tenant_burst": 10**7, "decisions_per_min": 10**9, "approvals_per_min": 10**9}})
    import uvloop

    import cosigner
    from cosigner.db.migrate import upgrade

    with tempfile.TemporaryDirectory() as tmp:
        if args.url:
            uvloop.install()
            results = asyncio.run(_measure(args, args.url, Path(tmp) / "keys"))
        elif args.db == "sqlite":
            url = f"sqlite+aiosqlite:///{tmp}/cosigner.db"
            asyncio.run(upgrade(url))
            return _serve(args, url, tmp)
        else:
            name = f"cosigner_hot_{os.getpid()}"
            asyncio.run(_pg_admin(args.pg, f'CREATE DATABASE "{name}"'))
            try:
                url = ("postgresql+asyncpg://" + args.pg.split("://", 1)[1].rsplit("/", 1)[0]
                       + "/" + name)
                asyncio.run(upgrade(url))
                return _serve(args, url, tmp)
            finally:
                asyncio.run(_pg_admin(args.pg, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    distinct = " distinct" if args.distinct_args else ""
    print(f"{args.system}{distinct} {args.db} {Path(cosigner.__file__).parent.parent} "
          f"c={args.c} n={args.n}: "
          "CPU µs/req " + " / ".join(f"{cpu:.0f}" for cpu, *_ in results)
          + "; wall req/s " + " / ".join(f"{rate:.0f}" for _, rate, *_ in results)
          + "; items/batch " + " / ".join(f"{size:.1f}" for _, _, size, _ in results)
          + ("; postgres CPU µs/req " + " / ".join(f"{pg:.0f}" for *_, pg in results)
             if args.db == "postgres" else ""))
    return 0


def _serve(args: argparse.Namespace, url: str, tmp: str) -> int:
    """Run ``--processes`` children of this script on the migrated ``url`` (each prints
    its line); nonzero when one failed."""
    env = dict(os.environ)
    env.setdefault("COSIGNER_KEY_ENCRYPTION_KEY",
                   base64.urlsafe_b64encode(os.urandom(32)).decode())
    barrier = Path(tmp) / "rounds"
    barrier.mkdir()
    command = [sys.executable, __file__, "--system", args.system, "--code", args.code,
               "--n", str(args.n), "--c", str(args.c), "--rounds", str(args.rounds),
               *(["--distinct-args"] if args.distinct_args else []),
               *(["--no-rego"] if args.no_rego else []),
               "--db", args.db, "--processes", str(args.processes), "--url", url,
               "--barrier", str(barrier)]
    children = [subprocess.Popen(command, env=env) for _ in range(args.processes)]
    return max(child.wait() for child in children)


if __name__ == "__main__":
    sys.exit(main())
