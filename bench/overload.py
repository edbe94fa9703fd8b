"""K30 under load: one tenant floods at several times capacity, another keeps deciding.

Bounded and loopback only; stops by itself (about 5 s + 2 × ``--seconds``):

1. capacity: tenant A alone, closed loop (``--connections``), no rate limits, 5 s →
   C decisions/s;
2. flood: the server restarted with tenant limits (``tenant_per_s`` = C/3, burst C; the
   limits are per replica), then for ``--seconds`` tenant A sends open-loop at
   ``--factor`` × C while tenant B sends at 10 % of C; every fourth B decision that is
   allowed is redeemed twice at once (at most one may succeed). Each sender is its own process.

Reported: B's errors and p50/p99 (from each request's scheduled send time, so a stalled
server is not hidden; B alone first, for the floor; plus one sequential B probe every
0.5 s from the driver), A's answers by status and whether every 429/503 carried
``Retry-After``, the server's RSS sampled every 0.5 s, that every 200 has its
``decision.made`` event, and that no permit was redeemed twice (answers and the log).

    .venv/bin/python bench/overload.py [--seconds 15] [--factor 5] [--database sqlite]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sqlite3
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.servers import CosignerDeployment, run  # noqa: E402

ACTORS = {"principal": {"id": "customer-42", "type": "customer"},
          "initiator": {"id": "agent-support", "type": "agent"}}


def decision_body() -> bytes:
    return json.dumps({"request_id": f"req-{uuid.uuid4().hex}", "run": {"id": "run-bench"},
                       **ACTORS, "tool": {"name": "get_order"},
                       "args": {"order_id": f"ord_{uuid.uuid4().hex[:12]}"},
                       "context": {}}).encode()


class Conn:
    """One keep-alive HTTP/1.1 connection on loopback (cheaper per request than httpx, so
    the senders can offer several times what the server can take)."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b""
                      ) -> tuple[int, dict[str, str], bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                f"{self.key}\r\nContent-Type: application/json\r\nContent-Length: "
                f"{len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        try:
            status_line = await self.reader.readuntil(b"\r\n")
            headers: dict[str, str] = {}
            while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            data = await self.reader.readexactly(int(headers.get("content-length", "0")))
        except (asyncio.IncompleteReadError, ConnectionError):
            self.writer = None
            return 0, {}, b""
        if headers.get("connection", "").lower() == "close":
            self.writer.close()
            self.writer = None
        return int(status_line.split()[1]), headers, data


async def _closed_loop(port: int, key: str, connections: int, seconds: float) -> int:
    done = 0
    stop = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        conn = Conn(port, key)
        while time.monotonic() < stop:
            status, _, _ = await conn.request("POST", "/v1/decisions", decision_body())
            done += status == 200
    await asyncio.gather(*(worker() for _ in range(connections)))
    return done


async def _open_loop(port: int, key: str, rate: float, seconds: float, connections: int,
                     redeem_twice: bool) -> dict[str, Any]:
    """Send at ``rate``/s for ``seconds`` over ``connections`` (each its share, on a
    fixed schedule); latency counted from the scheduled time."""
    out: dict[str, Any] = {"statuses": {}, "latencies_ms": [], "retry_after_missing": 0,
                           "decision_ids": [], "redeems": [], "sent": 0}
    start = time.monotonic() + 0.2
    per = rate / connections

    async def redeem_pair(decision: dict[str, Any]) -> None:
        body = json.dumps({"permit": decision["permit"]["token"], "tool": "get_order",
                           "args": decision["_args"]}).encode()
        pair = await asyncio.gather(*(Conn(port, key).request("POST", "/v1/permits/redeem",
                                                              body) for _ in range(2)))
        out["redeems"].append([status for status, _, _ in pair])

    async def worker(i: int) -> None:
        conn = Conn(port, key)
        k = 0
        pending: list[asyncio.Task[None]] = []
        while True:
            at = start + (k + i / connections) / per
            if at >= start + seconds:
                break
            delay = at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            k += 1
            raw = decision_body()
            status, headers, data = await conn.request("POST", "/v1/decisions", raw)
            out["sent"] += 1
            out["latencies_ms"].append((time.monotonic() - at) * 1000)
            out["statuses"][str(status)] = out["statuses"].get(str(status), 0) + 1
            if status in (429, 503) and "retry-after" not in headers:
                out["retry_after_missing"] += 1
            if status == 200:
                decision = json.loads(data)
                out["decision_ids"].append(decision["decision_id"])
                if redeem_twice and decision.get("permit") and k % 4 == 0:
                    decision["_args"] = json.loads(raw)["args"]
                    pending.append(asyncio.create_task(redeem_pair(decision)))
        await asyncio.gather(*pending)
    await asyncio.gather(*(worker(i) for i in range(connections)))
    return out


def _sender(port: int, key: str, rate: float, seconds: float, connections: int,
            redeem_twice: bool, queue: Any) -> None:
    queue.put(asyncio.run(_open_loop(port, key, rate, seconds, connections, redeem_twice)))


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--factor", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--database", choices=["sqlite"], default="sqlite")
    args = parser.parse_args()
    seconds = min(args.seconds, 60.0)  # bounded whatever is asked

    deployment = CosignerDeployment("overload", tenant="tenant-a", database=args.database)
    try:
        deployment.prepare()
        process = deployment.processes[0]
        cli = [sys.executable, "-m", "cosigner"]
        key_b = run(cli + ["principals", "add-key", "--tenant", "tenant-b", "--role",
                           "runtime", "--subject", "bench-b"],
                    process.env).strip().splitlines()[-1]
        unlimited = {"credential_per_s": 0, "credential_burst": 0, "tenant_per_s": 0,
                     "tenant_burst": 0, "decisions_per_min": 0, "approvals_per_min": 0}
        process.env["COSIGNER_RATE_LIMITS"] = json.dumps({"*": unlimited})
        deployment.start()
        allowed = asyncio.run(_closed_loop(process.port, deployment.key, args.connections,
                                           5.0))
        capacity = allowed / 5.0
        deployment.stop()
        print(f"capacity (tenant A alone, {args.connections} connections, 5 s): "
              f"{capacity:.0f} decisions/s", flush=True)

        process.env["COSIGNER_RATE_LIMITS"] = json.dumps({"*": {
            **unlimited, "tenant_per_s": max(1, int(capacity / 3)),
            "tenant_burst": max(1, int(capacity))}})
        deployment.start()
        rss_before = process.rss_mb()
        with httpx.Client(base_url=process.url, timeout=30,
                          headers={"Authorization": f"Bearer {key_b}"}) as probe:
            alone = []
            for _ in range(20):  # B alone, sequential: the latency floor on this machine
                began = time.monotonic()
                probe.post("/v1/decisions", content=decision_body(),
                           headers={"Content-Type": "application/json"})
                alone.append((time.monotonic() - began) * 1000)
        queue: Any = mp.get_context("spawn").Queue()
        senders = [
            mp.get_context("spawn").Process(target=_sender, args=(
                process.port, deployment.key, args.factor * capacity, seconds, 64, False,
                queue)),
            mp.get_context("spawn").Process(target=_sender, args=(
                process.port, key_b, max(1.0, capacity / 10), seconds, 16, True, queue)),
        ]
        for sender in senders:
            sender.start()
        rss: list[float] = []
        probes: list[float] = []  # one B decision every 0.5 s from here, sequentially
        stop_at = time.monotonic() + seconds + 1.0
        with httpx.Client(base_url=process.url, timeout=30,
                          headers={"Authorization": f"Bearer {key_b}"}) as probe:
            while time.monotonic() < stop_at:
                rss.append(process.rss_mb())
                began = time.monotonic()
                answer = probe.post("/v1/decisions", content=decision_body(),
                                    headers={"Content-Type": "application/json"})
                probes.append((time.monotonic() - began) * 1000)
                if answer.status_code != 200:
                    probes[-1] = float("inf")
                time.sleep(max(0.0, 0.5 - (time.monotonic() - began)))
        results = [queue.get(timeout=seconds + 120) for _ in senders]
        for sender in senders:
            sender.join(timeout=30)
        a, b = sorted(results, key=lambda r: -r["sent"])  # A sent the most
        deployment.stop()

        db_path = process.env["COSIGNER_DATABASE_URL"].split("///", 1)[1]
        with sqlite3.connect(db_path) as db:
            made = {row[0] for row in db.execute(
                "SELECT decision_id FROM audit_events WHERE type = 'decision.made'")}
            twice = db.execute(
                "SELECT COUNT(*) FROM (SELECT permit_jti FROM audit_events WHERE type = "
                "'permit.redeemed' GROUP BY permit_jti HAVING COUNT(*) > 1)").fetchone()[0]
        answered = a["decision_ids"] + b["decision_ids"]
        pairs = b["redeems"]
        report = {
            "capacity_per_s": round(capacity),
            "flood_seconds": seconds,
            "a_offered_per_s": round(args.factor * capacity),
            "a_sent": a["sent"], "a_statuses": a["statuses"],
            "a_retry_after_missing": a["retry_after_missing"],
            "b_offered_per_s": round(max(1.0, capacity / 10)),
            "b_sent": b["sent"], "b_statuses": b["statuses"],
            "b_errors": b["sent"] - b["statuses"].get("200", 0),
            "b_p50_ms": round(_pct(b["latencies_ms"], 0.50), 1),
            "b_p99_ms": round(_pct(b["latencies_ms"], 0.99), 1),
            "b_max_ms": round(max(b["latencies_ms"], default=float("nan")), 1),
            "b_alone_ms": {"p50": round(_pct(alone, 0.5), 1), "max": round(max(alone), 1)},
            "b_probe_ms": {"n": len(probes), "p50": round(_pct(probes, 0.5), 1),
                           "max": round(max(probes), 1)},
            "rss_mb": {"before": round(rss_before, 1), "min": round(min(rss), 1),
                       "max": round(max(rss), 1), "end": round(rss[-1], 1)},
            "every_200_logged": set(answered) <= made,
            "decisions_200": len(answered),
            "redeem_pairs": len(pairs),
            "redeem_pair_answers": {f"{x}+{y}": sum(sorted(p) == [x, y] for p in pairs)
                                    for x, y in {tuple(sorted(p)) for p in pairs}},
            "redeem_pairs_with_two_200": sum(p.count(200) == 2 for p in pairs),
            "permits_redeemed_twice_in_log": twice,
        }
        print(json.dumps(report, indent=2))
    finally:
        deployment.cleanup()


if __name__ == "__main__":
    main()
