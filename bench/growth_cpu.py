"""CPU per allow decision on a fresh log vs a seeded one, in process, alternating.

The HTTP cells of ``allow-py`` / ``allow-py-1m`` carry the machine's noise (wrk, other
processes on 2 cores); this measures only what the log's size can change: ``--decisions``
allow decisions through :func:`cosigner.decisions.pdp.decide` (group commit and all,
``--chunk`` concurrent, like the HTTP cells' connections) on a fresh migrated SQLite
file and on a copy of ``--seeded`` (made by bench/storage.py), A B A B for
``--rounds``. Prints the process CPU per decision (µs) of each, their ratio, and with
``--profile`` the functions whose own time differs most between the two::

    .venv/bin/python bench/storage.py --decisions 200000 --database /tmp/seed.db \
        --key-dir /tmp/seedkeys
    .venv/bin/python bench/growth_cpu.py --seeded /tmp/seed.db --key-dir /tmp/seedkeys \
        [--profile]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# bench/profile.py would shadow the standard library's profile module that cProfile uses.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import cProfile  # noqa: E402
import pstats  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402

sys.path.append(str(HERE))
sys.path.insert(0, str(HERE.parent))

from storage import seed  # noqa: E402 - this file's sibling


def one(url: str, keys: Path, n: int, chunk: int, profile: cProfile.Profile | None
        ) -> float:
    """CPU µs per decision of ``n`` decisions on ``url``."""
    if profile is not None:
        profile.enable()
    _, cpu = asyncio.run(seed(url, "bench", n, chunk=chunk, key_dir=keys, quiet=True))
    if profile is not None:
        profile.disable()
    return cpu / n * 1e6


def own_times(profile: cProfile.Profile) -> dict[str, float]:
    stats = pstats.Stats(profile)
    out: dict[str, float] = {}
    for (file, line, name), (_, _calls, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        out[f"{Path(file).name}:{line}({name})"] = tottime
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeded", type=Path, required=True)
    parser.add_argument("--key-dir", type=Path, required=True,
                        help="the key directory the seeded database was made with")
    parser.add_argument("--decisions", type=int, default=3000)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    from cosigner.db.migrate import upgrade

    with tempfile.TemporaryDirectory() as tmp:
        fresh, seeded = Path(tmp) / "fresh.db", Path(tmp) / "seeded.db"
        asyncio.run(upgrade(f"sqlite+aiosqlite:///{fresh}"))
        shutil.copy(args.seeded, seeded)
        keys = {"fresh": Path(tmp) / "keys", "seeded": args.key_dir}
        figures: dict[str, list[float]] = {"fresh": [], "seeded": []}
        profiles = {name: cProfile.Profile() if args.profile else None for name in figures}
        for _ in range(args.rounds):
            for name, path in (("fresh", fresh), ("seeded", seeded)):
                us = one(f"sqlite+aiosqlite:///{path}", keys[name], args.decisions, args.chunk,
                         profiles[name])
                figures[name].append(us)
                print(f"  {name:6} {us:7,.0f} µs CPU per decision", flush=True)
        mean = {name: sum(v) / len(v) for name, v in figures.items()}
        print(f"fresh {mean['fresh']:,.0f} µs, seeded {mean['seeded']:,.0f} µs: "
              f"seeded / fresh CPU = {mean['seeded'] / mean['fresh']:.3f}")
        if args.profile:
            a, b = (own_times(p) for p in profiles.values() if p is not None)
            n = args.decisions * args.rounds
            diff: list[tuple[float, str, Any, Any]] = sorted(
                ((b.get(k, 0) - a.get(k, 0), k, a.get(k, 0), b.get(k, 0))
                 for k in set(a) | set(b)), reverse=True)
            print("| function (own time) | fresh µs/decision | seeded µs/decision |")
            print("|---|---:|---:|")
            for _delta, key, x, y in diff[:12]:
                print(f"| {key} | {x / n * 1e6:.1f} | {y / n * 1e6:.1f} |")


if __name__ == "__main__":
    main()
