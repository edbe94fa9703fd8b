"""Server RSS while streaming an export of a large decision log (issue 6).

Seeds one tenant with N valid, hash-chained events (bulk inserts straight into SQLite, a
signed checkpoint every 1,000 events), starts a real ``cosigner serve`` process, streams
``GET /v1/audit/export?format=jsonl`` through httpx, and samples the server's VmRSS from
/proc every 20 ms. Then verifies the export offline with ``cosigner audit verify`` and
reports that process's peak RSS too.

    .venv/bin/python bench/audit_export.py [--events 1000000] [--workdir DIR]

Numbers are printed, never asserted; record them in bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cosigner.audit.chain import GENESIS, Event, event_body, hash_body  # noqa: E402
from cosigner.audit.checkpoints import sign_checkpoint  # noqa: E402
from cosigner.db.migrate import upgrade  # noqa: E402
from cosigner.keys.keyring import Keyring  # noqa: E402

TENANT = "bench"
SQLITE_TIME = "%Y-%m-%d %H:%M:%S.%f"


def seed(db_path: Path, key_dir: Path, events: int, every: int = 1000) -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    keyring = Keyring.load_or_create(key_dir, now=start, max_token_lifetime_s=3600)
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    prev, rows, cps = GENESIS, [], []
    actor = {"subject": "runtime-1", "principal_id": "p-1", "kind": "key"}
    for seq in range(1, events + 1):
        at = start + timedelta(milliseconds=seq)
        decision_id = f"00000000-0000-4000-8000-{seq:012d}"
        event = Event(type="decision.made", actor=actor, decision_id=decision_id,
                      run_id=f"run-{seq // 50}", tool="issue_refund",
                      args_hash="sha256:" + f"{seq:064x}", effect="allow" if seq % 3 else "deny",
                      principal="customer-42",
                      policy={"id": "refunds", "version": "1.0.0",
                              "revision": "sha256:" + "a" * 64},
                      payload={"request_id": f"req-{seq}", "reasons": [{"code": "within_auto_limit",
                               "message": "refund within the automatic limit"}],
                               "args": {"order_id": f"ord_{seq}", "amount_minor": seq % 90000,
                                        "currency": "USD", "reason_code": "duplicate_charge"}})
        body = event_body(event, tenant=TENANT, seq=seq, time=at, prev_hash=prev)
        text, digest = hash_body(body)
        rows.append((TENANT, seq, event.type, at.strftime(SQLITE_TIME), decision_id,
                     event.run_id, event.tool, event.effect, event.principal, "refunds",
                     "1.0.0", text, digest))
        prev = digest
        if seq % every == 0 or seq == events:
            cp = sign_checkpoint(keyring, tenant=TENANT, seq=seq, hash_=digest, at=at)
            cps.append((TENANT, seq, digest, at.strftime(SQLITE_TIME), cp.kid, cp.token))
        if len(rows) >= 20_000 or seq == events:
            conn.executemany(
                "INSERT INTO audit_events (tenant, seq, type, time, decision_id, run_id, tool,"
                " effect, principal, policy_id, policy_version, body, hash)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
            conn.executemany("INSERT INTO audit_checkpoints VALUES (?,?,?,?,?,?)", cps)
            conn.commit()
            rows, cps = [], []
    conn.execute("INSERT INTO audit_heads (tenant, seq, hash) VALUES (?,?,?)",
                 (TENANT, events, prev))
    conn.commit()
    conn.close()


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="cosigner-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    db_path, key_dir = work / "bench.db", work / "keys"
    url = f"sqlite+aiosqlite:///{db_path}"
    if not db_path.exists():
        asyncio.run(upgrade(url))
        started = time.perf_counter()
        seed(db_path, key_dir, args.events)
        print(f"seeded {args.events:,} events in {time.perf_counter() - started:.1f} s "
              f"({db_path.stat().st_size / 2**20:.0f} MiB)")

    env = dict(os.environ, COSIGNER_DATABASE_URL=url, COSIGNER_KEY_DIR=str(key_dir),
               COSIGNER_BUNDLE_DIRS=f'["{ROOT / "policies"}"]', COSIGNER_LOG_LEVEL="warning")
    key = subprocess.run([sys.executable, "-m", "cosigner", "principals", "add-key",
                          "--tenant", TENANT, "--role", "auditor"], env=env, cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout.strip()
    port = 18000 + os.getpid() % 1000
    server = subprocess.Popen([sys.executable, "-m", "cosigner", "serve", "--no-migrate",
                               "--port", str(port)], env=env, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        headers = {"Authorization": f"Bearer {key}"}
        httpx.get(base + "/v1/audit/events?limit=10", headers=headers, timeout=30)
        baseline = rss_kb(server.pid)
        peak = [baseline]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss_kb(server.pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        out = work / "export.jsonl"
        started = time.perf_counter()
        size = lines = 0
        with httpx.stream("GET", base + "/v1/audit/export", params={"format": "jsonl"},
                          headers=headers, timeout=600) as resp, out.open("wb") as handle:
            resp.raise_for_status()
            for chunk in resp.iter_bytes():
                handle.write(chunk)
                size += len(chunk)
                lines += chunk.count(b"\n")
        elapsed = time.perf_counter() - started
        done.set()
        sampler.join()
        print(f"export: {lines:,} lines, {size / 2**20:.0f} MiB in {elapsed:.1f} s "
              f"({lines / elapsed:,.0f} lines/s)")
        print(f"server RSS: before {baseline / 1024:.1f} MiB, peak during export "
              f"{peak[0] / 1024:.1f} MiB (+{(peak[0] - baseline) / 1024:.1f} MiB), "
              f"VmHWM {rss_kb(server.pid, 'VmHWM') / 1024:.1f} MiB")
        jwks = work / "jwks.json"
        jwks.write_bytes(httpx.get(base + "/.well-known/jwks.json").content)
    finally:
        server.terminate()
        server.wait(timeout=30)
    started = time.perf_counter()
    verify = subprocess.run([sys.executable, "-c", VERIFY, "audit", "verify", str(out),
                             "--jwks", str(jwks)], env=env, cwd=ROOT, capture_output=True,
                            text=True)
    print(f"verify: exit {verify.returncode} in {time.perf_counter() - started:.1f} s: "
          f"{verify.stdout.strip()} (verifier peak RSS "
          f"{int(verify.stderr.split()[-1]) / 1024:.1f} MiB)")


# Runs `cosigner audit verify` and prints its own peak RSS (KiB) last on stderr.
VERIFY = ("import resource, sys\nfrom cosigner.cli.main import main\ncode = main(sys.argv[1:])\n"
          "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
          "sys.exit(code)")


if __name__ == "__main__":
    main()
