"""CPU of the decision write path, in process: fresh decisions and retried request_ids.

Runs ``--decisions`` allow decisions (the calls of bench/storage.py) through
:func:`cosigner.decisions.pdp.decide` on a fresh SQLite file, 64 at a time, then the same
requests again (each a retry of a request_id already decided). Prints the process CPU per
fresh decision and per retry, and the event-loop thread's CPU per decision inside the
group committer's batch (``GroupCommitter._commit``: guard, inserts, chaining; the COMMIT
itself runs on another thread and is not counted)::

    .venv/bin/python bench/write_cost.py [--decisions 4000]
    # the same measure on another checkout (e.g. main before issue 20):
    git archive 2f44ba9 | tar -x -C /tmp/base
    PYTHONPATH=/tmp/base .venv/bin/python bench/write_cost.py --code /tmp/base

Machine noise moves these figures by ±10 %: alternate the two checkouts, several rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


async def measure(url: str, keys: Path, n: int) -> dict[str, float]:
    from cosigner.app import create_app
    from cosigner.core.settings import Settings
    from cosigner.db import group_commit
    from cosigner.decisions.pdp import DecisionRequest, decide
    from cosigner.identity.principals import Caller

    sys.path.insert(0, str(HERE))
    from storage import ROOT, body  # this file's sibling, whatever checkout runs

    spent = [0.0, 0]
    original = group_commit.GroupCommitter._commit

    async def timed(self: Any, batch: list[Any]) -> None:
        started = time.thread_time()
        await original(self, batch)
        spent[0] += time.thread_time() - started
        spent[1] += len(batch)

    group_commit.GroupCommitter._commit = timed  # type: ignore[method-assign]
    settings = Settings(database_url=url, bundle_dirs=[ROOT / "policies"], key_dir=keys,
                        log_level="warning", permit_ttl_s=86400)
    app = create_app(settings)
    caller = Caller(tenant="bench", principal_id="bench-principal", subject="bench-runtime",
                    roles=frozenset({"runtime"}), kind="key")
    reqs = []
    for i in range(n):
        raw = body("w", i)
        reqs.append(DecisionRequest(
            request_id=raw["request_id"], run=raw["run"], principal=raw["principal"],
            initiator=raw["initiator"], tool=raw["tool"], args=raw["args"],
            context=raw["context"], raw=raw))
    out: dict[str, float] = {}
    answers: list[list[Any]] = []
    async with app.router.lifespan_context(app):
        ctx = app.state.context
        for label in ("fresh", "retry"):
            spent[:] = [0.0, 0]
            cpu = time.process_time()
            got: list[Any] = []
            for k in range(0, n, 64):
                got += await asyncio.gather(*(decide(ctx, caller, r) for r in reqs[k:k + 64]))
            out[label] = (time.process_time() - cpu) / n * 1e6
            out[f"{label}_batch"] = spent[0] / max(1, spent[1]) * 1e6
            answers.append(got)
    group_commit.GroupCommitter._commit = original  # type: ignore[method-assign]
    if answers[0] != answers[1]:
        raise SystemExit("a retry answered differently from the first decision")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=4000)
    parser.add_argument("--code", type=Path, default=HERE.parent,
                        help="the checkout whose cosigner package is measured")
    args = parser.parse_args()
    sys.path.insert(0, str(args.code))
    import cosigner
    from cosigner.db.migrate import upgrade

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{tmp}/cosigner.db"
        asyncio.run(upgrade(url))
        res = asyncio.run(measure(url, Path(tmp) / "keys", args.decisions))
    print(f"{Path(cosigner.__file__).parent.parent}: {args.decisions} decisions; "
          f"fresh {res['fresh']:.0f} µs CPU (batch on the loop {res['fresh_batch']:.0f}); "
          f"retry {res['retry']:.0f} µs CPU (batch on the loop {res['retry_batch']:.0f})")


if __name__ == "__main__":
    main()
