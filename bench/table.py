"""Aggregate the rounds of a bench run and render the Markdown table.

Per system and concurrency: req/s, p50 and p99 are means over rounds; the ratio to the
floor is taken round by round (system ÷ its floor in the same round) and then
averaged, so drift between rounds cancels; a cell with any wrk error (non-2xx,
timeout, socket error) in any round is FAILED and its counts are shown.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
from statistics import mean
from typing import Any

from bench.servers import PEER_VENV, ROOT
from bench.systems import System
from bench.wrkrun import Result

Cells = dict[int, tuple[Result, float, str]]


def _ratio(results: dict[str, dict[int, Cells]], name: str, base: str,
           conc: int) -> float | None:
    pairs = [(cells[conc][0].rps, results[base][k][conc][0].rps)
             for k, cells in results.get(name, {}).items()
             if conc in cells and k in results.get(base, {}) and conc in results[base][k]]
    return mean(a / b for a, b in pairs) if pairs else None


def rows(systems: list[System], results: dict[str, dict[int, Cells]],
         concurrency: tuple[int, ...]) -> list[dict[str, Any]]:
    out = []
    for system in systems:
        per = results.get(system.name, {})
        for conc in concurrency:
            cells = [per[k][conc] for k in sorted(per) if conc in per[k]]
            if not cells:
                continue
            errors: dict[str, int] = {}
            for res, _, _ in cells:
                for k, v in res.errors.items():
                    errors[k] = errors.get(k, 0) + v
            notes = sorted({note for _, _, note in cells if note})
            out.append({
                "system": system.name, "concurrency": conc,
                "rps": mean(r.rps for r, _, _ in cells),
                "rps_rounds": [round(r.rps) for r, _, _ in cells],
                "p50_ms": mean(r.p50_ms for r, _, _ in cells),
                "p99_ms": mean(r.p99_ms for r, _, _ in cells),
                "ratio": _ratio(results, system.name, system.floor, conc)
                if system.floor else 1.0,
                "floor": system.floor or system.name,
                "rss_mb": system.rss_mb,
                "cpu_us_per_req": mean(cpu / r.requests * 1e6 for r, cpu, _ in cells
                                       if r.requests),
                "errors": {k: v for k, v in errors.items() if v},
                "failed": any(v for v in errors.values()) or bool(notes),
                "notes": notes,
            })
    for row in out:
        system = next(s for s in systems if s.name == row["system"])
        pg = [cpu / n * 1e6 for cpu, n in system.pg_cpu_s.get(row["concurrency"], []) if n]
        if pg:
            row["pg_cpu_us_per_req"] = mean(pg)
        if row["system"].startswith(("allow-py", "allow-rego", "lean-proto")) and "peer" in results:
            row["vs_peer"] = _ratio(results, row["system"], "peer", row["concurrency"])
    return out


def git_revision() -> str:
    """HEAD and whether cosigner/, policies/ or rego/ differ from it (call at the start)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
    dirty = " + uncommitted changes" if git("status", "--porcelain", "--", "cosigner",
                                            "policies", "rego") else ""
    return f"{git('rev-parse', '--short', 'HEAD')}{dirty}"


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor()}, {os.cpu_count()} cores"


def _peer_version() -> str:
    if not (PEER_VENV / "bin" / "python").exists():
        return "not installed"
    done = subprocess.run([str(PEER_VENV / "bin" / "python"), "-c",
                           "from importlib.metadata import version as v;"
                           "print(v('agent-governance-toolkit-core'))"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "not installed"


def _pg(row: dict[str, Any]) -> str:
    """`` + N pg`` (postgres CPU µs/req) beside the server CPU of a PostgreSQL system."""
    us = row.get("pg_cpu_us_per_req")
    return "" if us is None else f" + {us:,.0f} pg"


def render(rows: list[dict[str, Any]], systems: list[System], started: dt.datetime,
           args: argparse.Namespace) -> str:
    lines = [
        f"Measured {started:%Y-%m-%d %H:%M} UTC on {_cpu()}; Cosigner at {args.revision}; "
        f"agent-governance-toolkit-core {_peer_version()}.",
        "Load average (1 min) at start / end: "
        f"{args.load_start:.2f} / {os.getloadavg()[0]:.2f} (2 cores; anything else running "
        "on the machine shares them with the servers and wrk).",
        f"Command: `.venv/bin/python bench/run.py --duration {args.duration:g} "
        f"--rounds {args.rounds}" + (f" --only {args.only}" if args.only else "") + "`",
        "",
        "| system | conc | req/s | p50 ms | p99 ms | × floor | RSS MB | server CPU µs/req "
        "(+ postgres) | req/s by round | errors / notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        ratio = "—" if row["ratio"] is None else f"{row['ratio']:.2f}"
        if row["system"] == row["floor"]:
            ratio = "1 (floor)"
        elif row["floor"] != "floor":
            ratio += f" of {row['floor']}"
        problems = [f"{k} {v}" for k, v in row["errors"].items()] + row["notes"]
        status = ("**FAILED**: " + ", ".join(problems)) if row["failed"] else ""
        lines.append(
            f"| {row['system']} | {row['concurrency']} | {row['rps']:,.0f} | "
            f"{row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {ratio} | {row['rss_mb']:.0f} | "
            f"{row['cpu_us_per_req']:,.0f}{_pg(row)} | {' / '.join(map(str, row['rps_rounds']))} | "
            f"{status} |")
    versus = [f"{r['system']} c={r['concurrency']}: {r['vs_peer']:.2f}× the peer"
              for r in rows if r.get("vs_peer") is not None]
    if versus:
        lines += ["", "Against the peer (same rounds): " + "; ".join(versus) + "."]
    others = [f"- {s.name}: skipped — {s.skip}" for s in systems if s.skip]
    others += [f"- {s.name}: **FAILED** — {s.failed}" for s in systems if s.failed]
    others += [f"- {s.name}: {note}" for s in systems for note in s.notes]
    if others:
        lines += [""] + others
    return "\n".join(lines) + "\n"
