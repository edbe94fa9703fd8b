"""Where a serving process spends its time under load: py-spy + a short summary.

``bench/run.py --profile`` calls :func:`profile` on the allow-py system after the
measured rounds (never during them: sampling slows the process). Standalone::

    .venv/bin/python bench/profile.py [--system allow-py] [--seconds 15] [--connections 16]

py-spy comes from PyPI into ``bench/.venv-tools`` (not a project dependency). The raw
collapsed stacks are kept next to the summary (``var/bench/profile-<system>.txt``)
for flame graphs (``py-spy``'s own ``--format flamegraph``, or any folded-stack tool).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.servers import BENCH, ROOT, SetupError, ensure_wrk  # noqa: E402
from bench.systems import System, selected  # noqa: E402
from bench.wrkrun import run_wrk  # noqa: E402

TOOLS_VENV = BENCH / ".venv-tools"
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def ensure_py_spy() -> Path:
    exe = TOOLS_VENV / "bin" / "py-spy"
    if exe.exists():
        return exe
    print("installing py-spy into bench/.venv-tools", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(TOOLS_VENV)], check=True)
    subprocess.run([str(TOOLS_VENV / "bin" / "python"), "-m", "pip", "install", "-q",
                    "py-spy"], check=True)
    return exe


def _parts(frame: str) -> tuple[str, str]:
    """``(function, file)`` of a py-spy frame ``func (path/to/file.py:line)``; py-spy
    already shortens paths relative to sys.path (``sqlalchemy/engine/base.py``)."""
    match = FRAME.match(frame)
    return (match["func"], match["file"]) if match else (frame, "")


def _area(path: str) -> str:
    """A coarse bucket: a Cosigner module, else the top-level package or module."""
    if path.startswith("cosigner/"):
        return path.removesuffix(".py")
    return path.split("/", 1)[0].removesuffix(".py") or "?"


def summarize(collapsed: str, top: int = 20) -> str:
    """Self time by function, inclusive time by Cosigner function and by package, in %
    of the samples (with ``--gil``: of the time a thread held the GIL, i.e. ran Python)."""
    own: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_parts(f) for f in stack.split(";")]
        func, path = frames[-1]
        own[f"{func} ({path})"] += n
        for area in {_area(p) for _, p in frames if p}:
            areas[area] += n
        for name in {f"{f} ({p})" for f, p in frames
                     if p.startswith("cosigner/") and p != "cosigner/cli/main.py"}:
            ours[name] += n
    if not total:
        return "no samples"

    def table(title: str, counts: Counter[str]) -> list[str]:
        return [title] + [f"  {100 * n / total:5.1f}%  {name}"
                          for name, n in counts.most_common(top)]

    return "\n".join([f"{total} samples"]
                     + table("self time (leaf function):", own)
                     + table("inclusive, Cosigner functions (cosigner/):", ours)
                     + table("inclusive, by package (first path component):", areas))


def profile(system: System, *, seconds: float = 15, connections: int = 16,
            out_dir: Path = ROOT / "var" / "bench") -> str:
    """Start ``system`` (already prepared), load it with its workload, and sample it."""
    py_spy = ensure_py_spy()
    dep, work = system.deployment, system.workload
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / f"profile-{system.name}.txt"
    dep.start()
    try:
        run_wrk(dep.urls, work.script, connections=connections, seconds=2,
                args=lambda i: work.per_url(work.args(dep, "warm" + uuid.uuid4().hex[:6],
                                                      connections, 2), i),
                env=work.env(dep))
        base = work.args(dep, "prof" + uuid.uuid4().hex[:6], connections, seconds + 2)
        load = threading.Thread(target=run_wrk, kwargs=dict(
            urls=dep.urls, script=work.script, connections=connections, seconds=seconds + 2,
            args=lambda i: work.per_url(base, i), env=work.env(dep)))
        load.start()
        # --gil: only samples of the thread holding the GIL, i.e. running Python; the
        # event loop waiting in epoll and idle aiosqlite threads do not count.
        spy = subprocess.run([str(py_spy), "record", "--gil", "--format", "raw",
                              "--rate", "250",
                              "-d", str(int(seconds)), "-o", str(raw), "-p",
                              str(dep.pids()[0])], capture_output=True, text=True)
        load.join()
        if spy.returncode != 0 or not raw.exists():
            raise SetupError(f"py-spy failed: {spy.stderr[-800:]}")
    finally:
        dep.stop()
    return (f"profile of {system.name} at c={connections} for {seconds:g} s, samples "
            f"while holding the GIL "
            f"(raw stacks: {raw}):\n" + summarize(raw.read_text()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="allow-py")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    system = next(s for s in selected(args.system) if s.name == args.system)
    ensure_wrk()
    if system.skip:
        sys.exit(f"{system.name}: {system.skip}")
    system.deployment.prepare()
    try:
        print(profile(system, seconds=args.seconds, connections=args.connections))
    finally:
        system.deployment.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
