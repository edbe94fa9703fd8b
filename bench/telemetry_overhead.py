"""Overhead of metrics + tracing on the allow path: one interleaved run (issue 21).

Three ``cosigner serve`` deployments on their own fresh SQLite databases, set up like
``bench/run.py``'s ``allow-py`` (``bench/servers.py``):

* ``before``: the code of ``--base`` (a git revision without this instrumentation, default
  ``4810aa6``), exported with ``git archive`` into a temporary folder and served from it;
* ``metrics``: this tree, ``COSIGNER_METRICS_TOKEN`` set and ``/metrics`` scraped every 5 s,
  no ``OTEL_*`` (tracing off);
* ``traces``: as ``metrics`` plus ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at a local
  OTLP/HTTP sink started here (it answers 200 to every export), so every request records
  and exports its spans.

Rounds alternate (before, metrics, traces, before, …) so a change of machine speed hits
all alike. Load: ``--connections`` concurrent httpx clients in this process posting the
allow call (``issue_refund`` 5000, a new ``request_id`` each) for ``--seconds``. Reported
per round: requests/s and server CPU ms per decision (the server process's user+system
time over the cell), and the ratios to ``before`` of their medians.

    .venv/bin/python bench/telemetry_overhead.py [--rounds 3 --seconds 8 --connections 16]
        [--base REV]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.servers import ROOT, CosignerDeployment  # noqa: E402
from bench.systems import decision_body  # noqa: E402

TOKEN = "bench-metrics-token-0123456789"


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that accepts and drops every export."""

    exports = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        type(self).exports += 1
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        return None


async def load(url: str, key: str, seconds: float, connections: int,
               scrape: bool) -> tuple[int, int]:
    """Post allow decisions for ``seconds``; returns (answered 200 with allow, others)."""
    ok = bad = 0
    deadline = time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=connections + 1)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits,
                                 timeout=10) as client:

        async def worker() -> None:
            nonlocal ok, bad
            while time.monotonic() < deadline:
                body = decision_body(5000, run_id=f"run-{uuid.uuid4().hex[:8]}")
                resp = await client.post("/v1/decisions", json=body)
                if resp.status_code == 200 and resp.json()["effect"] == "allow":
                    ok += 1
                else:
                    bad += 1

        async def scraper() -> None:
            while time.monotonic() < deadline - 5:
                await asyncio.sleep(5)
                resp = await client.get("/metrics",
                                        headers={"Authorization": f"Bearer {TOKEN}"})
                assert resp.status_code == 200, resp.text

        tasks = [worker() for _ in range(connections)]
        if scrape:
            tasks.append(scraper())
        await asyncio.gather(*tasks)
    return ok, bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--base", default="4810aa6",
                        help="git revision served as 'before' (no metrics, no tracing)")
    args = parser.parse_args(argv)

    base_dir = Path(tempfile.mkdtemp(prefix="cosigner-bench-base-"))
    archive = subprocess.run(["git", "archive", args.base], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(base_dir)], input=archive, check=True)
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    deps = [CosignerDeployment(name, tenant="bench")
            for name in ("before", "metrics", "traces")]
    results: dict[str, list[tuple[float, float]]] = {d.name: [] for d in deps}
    try:
        for dep in deps:
            dep.prepare()
        deps[0].processes[0].cwd = base_dir
        for dep in deps[1:]:
            dep.processes[0].env["COSIGNER_METRICS_TOKEN"] = TOKEN
        deps[2].processes[0].env.update({
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.server_address[1]}",
            "OTEL_SERVICE_NAME": "cosigner-bench"})
        for round_no in range(1, args.rounds + 1):
            for dep in deps:
                dep.start()
                try:
                    url = dep.urls[0]
                    asyncio.run(load(url, dep.key, 2.0, args.connections, False))  # warm-up
                    cpu0 = dep.cpu_s()
                    ok, bad = asyncio.run(load(url, dep.key, args.seconds, args.connections,
                                               dep is not deps[0]))
                    cpu = dep.cpu_s() - cpu0
                finally:
                    dep.stop()
                rps = ok / args.seconds
                cpu_ms = 1000 * cpu / max(ok, 1)
                results[dep.name].append((rps, cpu_ms))
                print(f"round {round_no} {dep.name:8} {rps:7.0f} req/s  "
                      f"{cpu_ms:5.2f} server CPU ms/decision  ({bad} not allow)", flush=True)
    finally:
        for dep in deps:
            dep.cleanup()
        sink.shutdown()
    rps = {k: statistics.median(r for r, _ in v) for k, v in results.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in results.items()}
    for name in ("metrics", "traces"):
        print(f"{name}: median {rps[name]:.0f} req/s vs {rps['before']:.0f} "
              f"(ratio {rps[name] / rps['before']:.2f}); server CPU {cpu[name]:.2f} ms/decision "
              f"vs {cpu['before']:.2f} (ratio {cpu[name] / cpu['before']:.2f})")
    print(f"OTLP exports received by the sink: {_Sink.exports}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
