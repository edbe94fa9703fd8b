"""PostgreSQL's cost per allow decision, statement by statement (issue 20, session 9).

Two ``cosigner serve`` processes on a fresh database are loaded by two ``wrk`` (one per
process, ``bench/lua/decide.lua``, amount 5000: every decision an allow with its permit),
as ``allow-pg-2p`` in bench/systems.py. After a 3 s warm-up, for ``--seconds``, printed:

* requests per second, and CPU µs per decision of the two app processes and of
  PostgreSQL (``/proc/<pid>/stat`` of the database's backends and the cluster's WAL
  writer, checkpointer and background writer), the backends one by one;
* per statement (``pg_stat_statements``): calls, execution and planning µs (wall time:
  a lock wait counts), rows per call, plans made, shared buffers hit and WAL records,
  all per decision.

``pg_stat_statements`` must be loaded (``shared_preload_libraries``), so this runs
against a server of its own, never the shared test server, e.g.::

    initdb -D /tmp/pgss -U postgres --auth=trust
    cat >> /tmp/pgss/postgresql.conf <<EOF
    port = 5499
    unix_socket_directories = '/tmp'
    shared_preload_libraries = 'pg_stat_statements'
    pg_stat_statements.track = all
    pg_stat_statements.track_planning = on
    EOF
    pg_ctl -D /tmp/pgss -l /tmp/pgss.log start
    .venv/bin/python bench/pg_statements.py --admin postgresql://postgres@127.0.0.1:5499/postgres

``--code DIR``: the checkout to serve (its ``cosigner`` package, policies and Lua), e.g. a
``git archive`` of main for an A/B. Needs ``psql`` and ``wrk``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

ROOT = Path(__file__).resolve().parent.parent


def _psql(url: str, sql: str) -> str:
    return subprocess.run(["psql", url, "-AXtqc", sql], capture_output=True, text=True,
                          check=True).stdout


def _cpu(pids: list[int]) -> dict[int, float]:
    """utime + stime (s) by pid; a pid that is gone is left out."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admin", required=True,
                        help="libpq URL of the server's postgres database (superuser)")
    parser.add_argument("--code", default=str(ROOT))
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--c", type=int, default=16, help="connections in all")
    parser.add_argument("--ports", type=int, nargs=2, default=[5611, 5612])
    args = parser.parse_args()
    code = Path(args.code).resolve()
    name = f"cosigner_pgss_{os.getpid()}"
    base = urlsplit(args.admin)
    db_url = base._replace(path="/" + name).geturl()
    _psql(args.admin, f'CREATE DATABASE "{name}"')
    work = Path(tempfile.mkdtemp(prefix="pg-statements-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        _psql(db_url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        env = dict(os.environ, PYTHONPATH=f"{code}:{code}/clients/python",
                   COSIGNER_DATABASE_URL=db_url.replace("postgresql://",
                                                        "postgresql+asyncpg://", 1),
                   COSIGNER_KEY_DIR=str(work / "keys"), COSIGNER_LOG_LEVEL="warning",
                   COSIGNER_BUNDLE_DIRS=json.dumps([str(code / "policies"),
                                                    str(code / "rego")]),
                   COSIGNER_PERMIT_TTL_S="86400",
                   COSIGNER_RATE_LIMITS=json.dumps({"*": {
                       "credential_per_s": 10**7, "credential_burst": 10**7,
                       "tenant_per_s": 10**7, "tenant_burst": 10**7,
                       "decisions_per_min": 10**9, "approvals_per_min": 10**9}}))
        cli = [sys.executable, "-m", "cosigner"]
        subprocess.run(cli + ["migrate"], env=env, cwd=code, check=True, capture_output=True)
        key = subprocess.run(
            cli + ["principals", "add-key", "--tenant", "bench", "--role", "runtime",
                   "--subject", "bench-runtime"], env=env, cwd=code, check=True,
            capture_output=True, text=True).stdout.strip().splitlines()[-1]
        for port in args.ports:
            with open(work / f"serve{port}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    cli + ["serve", "--no-migrate", "--port", str(port)], env=env, cwd=code,
                    stdout=log, stderr=subprocess.STDOUT))
        for port in args.ports:
            for _ in range(600):
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        lua = code / "bench" / "lua"

        def load(seconds: int, tag: str) -> int:
            running = []
            for i, port in enumerate(args.ports):
                out = work / f"wrk{i}.json"
                running.append(subprocess.Popen(
                    [shutil.which("wrk") or "wrk", "-t", "1", "-c", str(args.c // 2), "-d",
                     f"{seconds}s", "--timeout", "10s", "-s", str(lua / "decide.lua"),
                     f"http://127.0.0.1:{port}", "--", f"{tag}p{i}", "5000", "allow"],
                    env=dict(os.environ, BENCH_KEY=key, BENCH_LUA_DIR=str(lua),
                             BENCH_OUT=str(out)),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for proc in running:
                proc.wait()
            return sum(json.loads((work / f"wrk{i}.json").read_text())["requests"]
                       for i in range(len(args.ports)))

        load(3, "warm")
        pg_pids = [int(p) for p in _psql(
            args.admin, f"SELECT pid FROM pg_stat_activity WHERE datname = '{name}' OR "
            "backend_type IN ('walwriter', 'checkpointer', 'background writer')").split()]
        app_pids = [p.pid for p in procs]
        count = "SELECT count(*) FROM decisions"
        _psql(db_url, "SELECT pg_stat_statements_reset()")
        pg0, app0, n0 = _cpu(pg_pids), _cpu(app_pids), int(_psql(db_url, count))
        started = time.monotonic()
        requests = load(args.seconds, "run")
        elapsed = time.monotonic() - started
        pg1, app1, n1 = _cpu(pg_pids), _cpu(app_pids), int(_psql(db_url, count))
        made = max(n1 - n0, 1)

        def per(before: dict[int, float], after: dict[int, float]) -> float:
            return sum(after[p] - before.get(p, 0.0) for p in after) / made * 1e6

        print(f"{requests} requests, {made} decisions, {requests / elapsed:.0f}/s; CPU µs "
              f"per decision: app {per(app0, app1):.0f}, PostgreSQL {per(pg0, pg1):.0f}")
        print("  by PostgreSQL pid:", ", ".join(
            f"{p} {(pg1[p] - pg0.get(p, pg1[p])) / made * 1e6:.0f}"
            for p in sorted(pg1, key=lambda p: pg0.get(p, pg1[p]) - pg1[p])))
        rows = _psql(db_url, (
            "SELECT calls, total_exec_time, total_plan_time, rows, plans, shared_blks_hit, "
            "wal_records, regexp_replace(left(query, 110), '\\s+', ' ', 'g') "
            "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE "
            f"datname = '{name}') ORDER BY total_exec_time + total_plan_time DESC"))
        print(f"{'calls':>7} {'exec µs':>8} {'plan µs':>8} {'rows/call':>9} {'plans':>6} "
              f"{'hits':>6} {'WAL':>6}  (per decision)  statement")
        for line in rows.splitlines():
            calls, run, plan, got, plans, hits, wal, text = line.split("|", 7)
            print(f"{int(calls) / made:7.3f} {float(run) * 1e3 / made:8.1f} "
                  f"{float(plan) * 1e3 / made:8.1f} {int(got) / max(int(calls), 1):9.1f} "
                  f"{plans:>6} {int(hits) / made:6.1f} {int(wal) / made:6.2f}  {text}")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
        _psql(args.admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
