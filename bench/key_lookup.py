"""API-key lookups: does a known key id answer faster than an unknown one? (issue 13, fault 6)

Interleaves, round by round, ``KeyAuthenticator.authenticate`` with
  known    the right key (its id cached after the first round),
  unknown  a well-formed key whose id does not exist (one fixed id, as a prober repeats),
  wrong    a known id with a wrong secret,
and, for the first lookup of an id (nothing cached), a fresh known key against a fresh
unknown id. Prints the median and p90 of each in microseconds. Measured, never asserted.

    .venv/bin/python bench/key_lookup.py                      # temporary SQLite file
    .venv/bin/python bench/key_lookup.py --rounds 20000 \\
        --database-url postgresql+asyncpg://postgres@127.0.0.1:5432/cosigner_bench
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cosigner.core.clock import system_clock  # noqa: E402
from cosigner.core.errors import Unauthenticated  # noqa: E402
from cosigner.db.database import Database  # noqa: E402
from cosigner.db.migrate import upgrade  # noqa: E402
from cosigner.identity.principals import KeyAuthenticator, create_api_key  # noqa: E402


async def timed(auth: KeyAuthenticator, key: str) -> float:
    start = time.perf_counter()
    try:
        await auth.authenticate(key)
    except Unauthenticated:
        pass
    return (time.perf_counter() - start) * 1e6


def summary(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(len(ordered) * 0.9)]
    return f"{name:>14}  median {statistics.median(ordered):8.1f} µs   p90 {p90:8.1f} µs"


async def main(url: str, rounds: int, first_lookups: int) -> None:
    await upgrade(url)
    db = Database(url)
    try:
        tenant = f"bench-{secrets.token_hex(4)}"

        async def new_key() -> str:
            key, _ = await create_api_key(db, tenant=tenant, roles=["runtime"], subject=None,
                                          clock=system_clock)
            return key

        known = await new_key()
        unknown = "csk_" + secrets.token_hex(8) + "_" + secrets.token_urlsafe(32)
        wrong = known[:21] + secrets.token_urlsafe(32)
        auth = KeyAuthenticator(db)
        samples: dict[str, list[float]] = {"known": [], "unknown": [], "wrong secret": []}
        for i in range(rounds):
            auth.observe(0, fresh_for_s=60)  # what the replica poll does every interval
            order = [("known", known), ("unknown", unknown), ("wrong secret", wrong)]
            for name, key in order[i % 3:] + order[:i % 3]:
                samples[name].append(await timed(auth, key))
        first: dict[str, list[float]] = {"first known": [], "first unknown": []}
        fresh = [await new_key() for _ in range(first_lookups)]
        for i, key in enumerate(fresh):
            pair = [("first known", key),
                    ("first unknown", "csk_" + secrets.token_hex(8) + "_" + key[21:])]
            for name, candidate in pair if i % 2 else pair[::-1]:
                first[name].append(await timed(auth, candidate))
        print(f"{url.split(':', 1)[0]}, {rounds} interleaved rounds, "
              f"{first_lookups} first lookups")
        for name, values in {**samples, **first}.items():
            print(summary(name, values[1:] if name == "known" else values))
    finally:
        await db.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url")
    parser.add_argument("--rounds", type=int, default=20_000)
    parser.add_argument("--first-lookups", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = args.database_url or f"sqlite+aiosqlite:///{folder}/bench.db"
        asyncio.run(main(url, args.rounds, args.first_lookups))
