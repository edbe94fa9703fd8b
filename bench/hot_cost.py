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
request, so each opens its own approval request. A fresh SQLite file per run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ARGS = {"order_id": "ord_8472", "amount_minor": 5000, "currency": "USD",
        "reason_code": "duplicate_charge"}


def _decision(tag: str, amount: int) -> bytes:
    return json.dumps({
        "request_id": "req-" + tag, "run": {"id": "run-" + tag, "step": 1},
        "principal": {"id": "customer-42", "type": "customer"},
        "initiator": {"id": "agent-support", "type": "agent"},
        "tool": {"name": "issue_refund", "side_effect": "financial"},
        "args": dict(ARGS, amount_minor=amount), "context": {}},
        separators=(",", ":")).encode()


async def _measure(args: argparse.Namespace, url: str, keys: Path
                   ) -> list[tuple[float, float, float]]:
    from cosigner.app import create_app
    from cosigner.core.clock import system_clock
    from cosigner.core.settings import Settings
    from cosigner.db.database import Database
    from cosigner.identity.principals import create_api_key

    db = Database(url)
    key, _ = await create_api_key(db, tenant="bench", roles=["runtime"],
                                  subject="bench-runtime", clock=system_clock)
    await db.dispose()
    root = Path(args.code)
    app = create_app(Settings(database_url=url, key_dir=keys, log_level="warning",
                              bundle_dirs=[root / "policies", root / "rego"],
                              permit_ttl_s=86400))
    auth = ("Bearer " + key).encode()
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
        if out[0]["status"] != 200:
            failures.append(out[1]["body"][:200])
        return bytes(out[1]["body"])

    results = []
    async with app.router.lifespan_context(app):
        for round_no in range(args.rounds + 1):  # round 0 warms up
            n = args.n if round_no else 300
            tag = f"r{round_no}x{os.getpid()}"
            if args.system == "redeem":
                work = []
                for i in range(n):
                    made = json.loads(await one("/v1/decisions", _decision(f"{tag}-{i}", 5000)))
                    work.append(("/v1/permits/redeem", json.dumps({
                        "permit": made["permit"]["token"], "tool": "issue_refund",
                        "args": ARGS}).encode()))
            else:
                amount = 5000 if args.system == "allow" else 150_000
                work = [("/v1/decisions", _decision(f"{tag}-{i}", amount)) for i in range(n)]
            queue = iter(work)

            async def worker(queue: Any) -> None:
                for path, body in queue:
                    await one(path, body)

            stats = app.state.context.log_writer.stats
            batches, items = stats.batches, stats.items
            started, wall = time.process_time(), time.perf_counter()
            await asyncio.gather(*(worker(queue) for _ in range(args.c)))
            if round_no:
                results.append(((time.process_time() - started) / n * 1e6,
                                n / (time.perf_counter() - wall),
                                (stats.items - items) / max(1, stats.batches - batches)))
    if failures:
        sys.exit(f"{len(failures)} requests failed, e.g. {failures[0]!r}")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", choices=["allow", "redeem", "approval"], default="redeem")
    parser.add_argument("--code", default=str(Path(__file__).resolve().parent.parent),
                        help="the checkout to measure (its cosigner package is imported)")
    parser.add_argument("--n", type=int, default=1500)
    parser.add_argument("--c", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    sys.path.insert(0, args.code)
    os.environ["COSIGNER_RATE_LIMITS"] = json.dumps({"*": {
        "credential_per_s": 10**7, "credential_burst": 10**7, "tenant_per_s": 10**7,
        "tenant_burst": 10**7, "decisions_per_min": 10**9, "approvals_per_min": 10**9}})
    import uvloop

    import cosigner
    from cosigner.db.migrate import upgrade

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{tmp}/cosigner.db"
        asyncio.run(upgrade(url))
        uvloop.install()
        results = asyncio.run(_measure(args, url, Path(tmp) / "keys"))
    print(f"{args.system} {Path(cosigner.__file__).parent.parent} c={args.c} n={args.n}: "
          "CPU µs/req " + " / ".join(f"{cpu:.0f}" for cpu, _, _ in results)
          + "; wall req/s " + " / ".join(f"{rate:.0f}" for _, rate, _ in results)
          + "; items/batch " + " / ".join(f"{size:.1f}" for _, _, size in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
