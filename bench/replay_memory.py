"""Replay's memory and time against the size of the log (measured, never asserted).

Seeds a fresh SQLite database with N decisions through the real decide path (the live
and candidate bundles of ``tests/http/replay_helpers.py``), then replays the candidate
over them under ``tracemalloc`` and prints the peak of Python allocations during the
replay, for each N. A flat peak means the log is streamed (keyset pages), not loaded::

    .venv/bin/python bench/replay_memory.py [--sizes 1000 10000] [--page 500]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cosigner.app import create_app  # noqa: E402
from cosigner.core.settings import Settings  # noqa: E402
from cosigner.db.migrate import upgrade  # noqa: E402
from cosigner.policy import replay  # noqa: E402
from tests.http.replay_helpers import (  # noqa: E402
    CANDIDATE,
    LIVE,
    runtime_caller,
    seed,
    write_version,
)

KEK = "YmVuY2gta2V5LWVuY3J5cHRpb24ta2V5LTMyYnl0ZXM"


async def one(size: int, page: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        url = f"sqlite+aiosqlite:///{folder / 'cosigner.db'}"
        await upgrade(url)
        write_version(folder / "bundles", "bench", "2.0.0", LIVE, ["bench"])
        write_version(folder / "bundles", "bench-candidate", "1.0.0", CANDIDATE, ["x"])
        settings = Settings(database_url=url, bundle_dirs=[folder / "bundles"],
                            key_dir=folder / "keys", key_encryption_key=KEK,
                            log_batch_max=1000)
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            ctx = app.state.context
            started = time.perf_counter()
            await seed(ctx, runtime_caller("bench"), size)
            seeded = time.perf_counter() - started
            candidate = ctx.store.snapshot.bundles["bench-candidate"]["1.0.0"]
            tracemalloc.start()
            started = time.perf_counter()
            report = await replay.replay(ctx.db, candidate, tenant="bench", since=None,
                                         until=None, page=page)
            took = time.perf_counter() - started
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert report.decisions == size, report.decisions
        print(f"{size:>7} decisions: seeded {seeded:5.1f} s, replayed {took:5.2f} s "
              f"({size / took:,.0f}/s), tracemalloc peak {peak / 1024:,.0f} KiB, "
              f"changed {report.changed}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--page", type=int, default=replay.PAGE)
    args = parser.parse_args()
    for size in args.sizes:
        await one(size, args.page)



if __name__ == "__main__":
    asyncio.run(main())
