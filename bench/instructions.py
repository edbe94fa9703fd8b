"""Instructions per request, in process, counted by valgrind's callgrind (issue 20).

On this shared 2-core machine CPU time per request moves by 10–30 % with whatever else
runs (another suite, a helper's benchmark), more than most single changes to the hot
paths. callgrind counts instructions instead of timing them: the same code, inputs and
environment give nearly the same count whatever the machine is doing. This script runs
:mod:`bench.hot_cost`'s child (the whole ASGI app in process, its group commit and COMMIT
thread; Python rules only, ``--no-rego``: rego-cpp's allocator cannot start under
valgrind) under callgrind twice, with ``--n`` and ``--n2`` requests after the same
warm-up, and prints ``(I(n2) - I(n)) / (n2 - n)``: the instructions one more request
costs, start-up and warm-up cancelled out. Several ``--code`` folders (``git archive``
checkouts) are measured in turn, alternated ``--pairs`` times::

    .venv/bin/python bench/instructions.py --system approval --code /tmp/A --code /tmp/B

Instructions are not time (a cache miss or a system call costs more than its count, and
fsync waits are not counted at all), so a change is confirmed over HTTP too
(``bench/run.py``); but for CPU work on the loop an instruction count is a steady guide.
Under valgrind the program runs ~50× slower on one core: batches still fill (the clients
are in lockstep), timers fire later relative to the work.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUMMARY = re.compile(r"^summary:\s+(\d+)", re.MULTILINE)


def count(code: str, system: str, n: int, c: int) -> int:
    """Instructions of hot_cost's measuring child for ``n`` requests (plus its warm-up)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.%p"
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--trace-children=yes",
             f"--callgrind-out-file={out}", sys.executable, str(HERE / "hot_cost.py"),
             "--system", system, "--n", str(n), "--c", str(c), "--rounds", "1",
             "--code", code, "--no-rego"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for path in Path(tmp).glob("callgrind.*"):
            text = path.read_text(errors="replace")
            if "--url" in text.split("\n", 20)[-1] or "--url" in text[:4000]:
                found = SUMMARY.search(text)
                if found:
                    return int(found[1])
    raise SystemExit(f"no measuring child found for {code}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--system", default="allow",
                        choices=["allow", "redeem", "approval", "join"])
    parser.add_argument("--code", action="append", required=True,
                        help="a checkout to measure (repeat to compare)")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--n2", type=int, default=600)
    parser.add_argument("--c", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.pairs):
        for code in args.code:
            small = count(code, args.system, args.n, args.c)
            large = count(code, args.system, args.n2, args.c)
            per = (large - small) / (args.n2 - args.n)
            print(f"{args.system} {code} c={args.c}: {per:,.0f} instructions per request "
                  f"(n {args.n} → {args.n2}: {small:,} → {large:,})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
