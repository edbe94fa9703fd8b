"""``make bench``: every system, interleaved, at concurrency 16 and 64, with wrk.

One run measures the floor (a bare FastAPI endpoint), Cosigner's decision paths and
the peer's policy-server in rounds (A B C … A B C …) so drift of the machine spreads
over every system alike; ratios are taken to the floor measured in the same round.
See bench/README.md for what each system is and how to read the table.

    .venv/bin/python bench/run.py [--duration 10] [--rounds 2] [--only allow-py,peer]
                                  [--quick] [--profile]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import table  # noqa: E402
from bench.servers import ROOT, CosignerDeployment, SetupError, ensure_wrk, pg_cpu_delta  # noqa: E402,E501
from bench.systems import Skip, System, selected  # noqa: E402
from bench.wrkrun import Result, run_wrk  # noqa: E402

CONCURRENCY = (16, 64)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds per measured cell (default 10)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("--only", help="comma-separated systems (their floor is added)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2 s cells, 1 round, 1 s checks")
    parser.add_argument("--check-seconds", type=float, default=2.0,
                        help="verified warm-up before each system's cells (default 2)")
    parser.add_argument("--profile", action="store_true",
                        help="afterwards, profile allow-py under load with py-spy "
                             "(bench/profile.py) and print where the time goes")
    parser.add_argument("--no-extras", action="store_true",
                        help="skip the idle-RSS and storage rows printed after the table "
                             "(bench/idle_rss.py, bench/storage.py)")
    parser.add_argument("--out", type=Path, default=ROOT / "var" / "bench",
                        help="folder for the raw JSON and the Markdown table")
    args = parser.parse_args(argv)
    args.load_start = os.getloadavg()[0]
    args.revision = table.git_revision()
    if args.quick:
        args.duration, args.rounds, args.check_seconds = 2.0, 1, 1.0
    return args


def check(system: System, seconds: float) -> None:
    """Warm up with the measured script in check mode; every answer must be a 200
    carrying the expected effect, or the system is failed."""
    dep, work = system.deployment, system.workload
    tag = f"chk{uuid.uuid4().hex[:8]}"
    base = work.args(dep, tag, 16, seconds)
    res = run_wrk(dep.urls, work.script, connections=16, seconds=seconds, check=True,
                  args=lambda i: work.per_url(base, i), env=work.env(dep))
    bad = {k: v for k, v in res.statuses.items() if k != "200"}
    wrong = {k: v for k, v in res.effects.items() if work.expect and k != work.expect}
    if res.requests == 0 or bad or wrong or res.error_count:
        raise SetupError(f"check run: statuses {res.statuses}, effects {res.effects}, "
                         f"errors {res.errors}; first bad body: {res.bad_body}")


def measure(system: System, round_no: int, seconds: float,
            check_seconds: float) -> dict[int, tuple[Result, float, str]]:
    """Start the system, verify it, run its cells, read RSS, stop it.
    Returns {connections: (result, server CPU s, note)} and sets ``system.rss_mb`` and,
    on PostgreSQL, ``system.pg_cpu_s`` ({connections: postgres CPU s})."""
    dep, work = system.deployment, system.workload
    cells: dict[int, tuple[Result, float, str]] = {}
    dep.start()
    try:
        if round_no == 0:
            note = work.probe(dep)
            if note:
                system.notes.append(note)
        check(system, check_seconds)
        for conc in CONCURRENCY:
            tag = f"r{round_no}c{conc}{uuid.uuid4().hex[:6]}"
            base = work.args(dep, tag, conc, seconds)
            pg = isinstance(dep, CosignerDeployment) and dep.pg_name is not None
            pg0 = dep.pg_cpu() if pg else {}
            cpu0 = dep.cpu_s()
            res = run_wrk(dep.urls, work.script, connections=conc, seconds=seconds,
                          args=lambda i, base=base: work.per_url(base, i),
                          env=work.env(dep))
            cpu = dep.cpu_s() - cpu0
            if pg:
                system.pg_cpu_s.setdefault(conc, []).append(
                    (pg_cpu_delta(pg0, dep.pg_cpu()), res.requests))
            cells[conc] = (res, cpu, work.after_cell(conc, res.rps, res.requests))
            print(f"  {system.name:12} c={conc:<3} {res.rps:9.0f} req/s  "
                  f"p50 {res.p50_ms:7.2f} ms  p99 {res.p99_ms:8.2f} ms  "
                  f"errors {res.error_count}", flush=True)
        system.rss_mb = max(system.rss_mb, dep.rss_mb())
    finally:
        dep.stop()
    return cells


#: Issue 20's targets measured outside wrk: (label, script and arguments, line prefix kept).
EXTRAS = (
    ("idle RSS of a Python-rules-only server", ["bench/idle_rss.py"], "idle RSS"),
    ("storage per allow decision, 5,000 decisions", ["bench/storage.py", "--decisions",
                                                     "5000"], "allow decisions:"),
)


def extras() -> str:
    """The rows of the issue-20 targets that are not throughput (idle RSS ≤ 80 MB,
    ≤ 2 KB per allow decision), measured after the table by their own scripts (each a
    fresh server or database), as Markdown list items."""
    lines = ["", "Other targets (after the table, nothing else of this run running):"]
    for label, command, prefix in EXTRAS:
        print(f"extra: {label}", flush=True)
        done = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True,
                              text=True)
        found = [line for line in done.stdout.splitlines() if line.startswith(prefix)]
        result = found[-1] if done.returncode == 0 and found else (
            f"**FAILED** (exit {done.returncode}): {done.stderr.strip()[-300:]}")
        lines.append(f"- {label} (`{' '.join(command)}`): {result}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_wrk()
    systems = selected(args.only)
    started = dt.datetime.now(dt.UTC)
    print(f"bench: {len(systems)} systems × {args.rounds} rounds × {len(CONCURRENCY)} "
          f"concurrencies × {args.duration:g} s", flush=True)
    for system in systems:
        if system.skip:
            print(f"  skip {system.name}: {system.skip}", flush=True)
            continue
        try:
            system.deployment.prepare()
        except SetupError as exc:
            system.skip = f"setup failed: {exc}"
            print(f"  skip {system.name}: {system.skip}", flush=True)

    results: dict[str, dict[int, dict[int, tuple[Result, float, str]]]] = {}
    try:
        for round_no in range(args.rounds):
            print(f"round {round_no + 1}/{args.rounds}", flush=True)
            for system in systems:
                if system.skip or system.failed:
                    continue
                try:
                    cells = measure(system, round_no, args.duration, args.check_seconds)
                except Skip as exc:
                    system.skip = str(exc)
                    print(f"  skip {system.name}: {exc}", flush=True)
                    continue
                except (SetupError, RuntimeError) as exc:
                    system.failed = str(exc)
                    print(f"  FAILED {system.name}: {exc}", flush=True)
                    continue
                results.setdefault(system.name, {})[round_no] = cells
    finally:
        for system in systems:
            if system.name != "allow-py" or not args.profile:
                system.deployment.cleanup()

    rows = table.rows(systems, results, CONCURRENCY)
    text = table.render(rows, systems, started, args)
    if not args.no_extras:
        text += extras()
    print()
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    (args.out / "latest.md").write_text(text)
    (args.out / f"bench-{stamp}.json").write_text(json.dumps(
        {"started": started.isoformat(), "argv": sys.argv[1:], "rows": rows,
         "rounds": {name: {str(k): {str(c): {"result": r.as_dict(), "server_cpu_s": cpu,
                                             "note": note}
                                    for c, (r, cpu, note) in cells.items()}
                           for k, cells in per.items()}
                    for name, per in results.items()}}, indent=1))
    print(f"\nraw figures: {args.out / f'bench-{stamp}.json'}")

    if args.profile:
        from bench import profile

        allow = next((s for s in systems if s.name == "allow-py"), None)
        if allow is None or allow.skip or allow.failed:
            print("profile: allow-py was not measured", file=sys.stderr)
        else:
            try:
                time.sleep(1)
                print(profile.profile(allow, seconds=max(args.duration, 10)))
            finally:
                allow.deployment.cleanup()
    failed = [s.name for s in systems if s.failed]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
