"""Drive ``wrk`` and read back what its Lua ``done()`` wrote (bench/lua/report.lua).

Two processes (the PostgreSQL deployment and its floor) are loaded by two wrk
instances running at the same time, one per port, each with half the connections;
their throughputs add up and their latency distributions are merged from 1000
percentile points each, weighted by request count. No proxy sits in front: a Python
round-robin would be the bottleneck it measures, and wrk cannot split one run over
two hosts.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LUA = Path(__file__).resolve().parent / "lua"
#: wrk's default is 2 s; a slow path must show as slow, not as timeouts.
TIMEOUT = "10s"


@dataclass
class Result:
    """One cell: figures summed or merged over the wrk instances that produced them."""

    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    errors: dict[str, int]
    statuses: dict[str, int] = field(default_factory=dict)
    effects: dict[str, int] = field(default_factory=dict)
    bad_body: str | None = None

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def run_wrk(urls: list[str], script: str, *, connections: int, seconds: float,
            args: Callable[[int], list[str]] | None = None,
            env: dict[str, str] | None = None,
            check: bool = False, threads: int = 2) -> Result:
    """Load every URL at once for ``seconds``; ``connections`` is the total over URLs.

    One URL: ``threads`` wrk threads. Several: one wrk per URL, one thread each, so the
    load generator has the same two threads either way. ``args(i)`` gives the script
    arguments of the wrk instance for URL ``i``.
    """
    per_url = max(1, connections // len(urls))
    wrk_threads = threads if len(urls) == 1 else 1
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    with tempfile.TemporaryDirectory(prefix="bench-wrk-") as tmp:
        for i, url in enumerate(urls):
            out = Path(tmp) / f"out{i}.json"
            full_env = dict(os.environ, **(env or {}), BENCH_LUA_DIR=str(LUA),
                            BENCH_OUT=str(out))
            if check:
                full_env["BENCH_CHECK"] = "1"
            cmd = ["wrk", "-t", str(min(wrk_threads, per_url)), "-c", str(per_url),
                   "-d", f"{max(1, round(seconds))}s", "--timeout", TIMEOUT,
                   "-s", str(LUA / script), url]
            extra = args(i) if args else []
            if extra:
                cmd += ["--", *extra]
            procs.append((subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT), out))
        parts = []
        for proc, out in procs:
            output, _ = proc.communicate()
            if proc.returncode != 0 or not out.exists():
                raise RuntimeError(f"wrk failed ({proc.returncode}): "
                                   f"{output.decode(errors='replace')[-1500:]}")
            parts.append(json.loads(out.read_text(errors="replace")))
    return merge(parts)


def merge(parts: list[dict[str, Any]]) -> Result:
    requests = sum(p["requests"] for p in parts)
    rps = sum(p["requests"] / (p["duration_us"] / 1e6) for p in parts)
    seconds = max(p["duration_us"] for p in parts) / 1e6
    errors: dict[str, int] = {}
    statuses: dict[str, int] = {}
    effects: dict[str, int] = {}
    for p in parts:
        for bucket, into in ((p["errors"], errors), (p["statuses"], statuses),
                             (p["effects"], effects)):
            for k, v in bucket.items():
                into[k] = into.get(k, 0) + v
    return Result(requests=requests, seconds=seconds, rps=rps,
                  p50_ms=percentile(parts, 50) / 1000, p99_ms=percentile(parts, 99) / 1000,
                  errors=errors, statuses=statuses, effects=effects,
                  bad_body=next((p["bad_body"] for p in parts if p.get("bad_body")), None))


def percentile(parts: list[dict[str, Any]], q: float) -> float:
    """The q-th percentile (µs) of the mixture of the parts' latency distributions.

    Each part contributes its 1000 percentile points (0.1 % apart), each weighted by
    its request count / 1000; exact for one part at the points it reports.
    """
    if len(parts) == 1:
        return float(parts[0]["percentiles_us"][round(q * 10) - 1])
    points = sorted((value, p["requests"] / 1000) for p in parts
                    for value in p["percentiles_us"])
    total = sum(p["requests"] for p in parts)
    target = total * q / 100
    seen = 0.0
    for value, weight in points:
        seen += weight
        if seen >= target - 1e-9:
            return float(value)
    return float(points[-1][0])
