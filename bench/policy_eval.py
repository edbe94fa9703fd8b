"""Policy evaluation alone, in process: what one decision's policy step costs.

No HTTP and no database: each reference bundle (``policies/refunds`` in Python rules,
``rego/refunds`` in Rego) is loaded the way the server loads it and evaluated on the
allow, require_approval and deny refund inputs, engine alone (``run_bundle``: engine +
result validation) and with the tool catalogue's schema check first (``evaluate_case``,
as ``decide()`` does). Prints µs per evaluation and evaluations/s on one core. The same
input is evaluated again and again, so the Rego rows are the engine's result memo
answering (session 13); ``--parts`` shows rego-cpp's own evaluation::

    .venv/bin/python bench/policy_eval.py [--seconds 1.0] [--parts]

``--parts`` adds the embedded Rego engine's own steps for the same inputs, as µs of
process CPU per step (best of 5 rounds of 1,000): the projection to the members the
modules read, building and setting rego-cpp's input, the query of the entrypoint (its
output read and parsed), a whole evaluation by rego-cpp and one answered by the engine's
result memo (the input seen before), and regopy's own ``Interpreter.set_input`` and
``query_bundle_entrypoint`` for comparison.

It puts the HTTP table of bench/run.py in proportion: a few µs here against
milliseconds per request there means the policy engine is not the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cosigner.policy.cases import evaluate_case, with_defaults  # noqa: E402
from cosigner.policy.store import PolicyStore, run_bundle  # noqa: E402

AMOUNTS = {"allow": 5000, "require_approval": 150000, "deny": 250000}
BUNDLES = {"python": ROOT / "policies" / "refunds", "rego": ROOT / "rego" / "refunds"}


def refund_input(amount: int) -> dict[str, Any]:
    return with_defaults({
        "tool": {"name": "issue_refund", "side_effect": "financial"},
        "args": {"order_id": "ord_8472", "amount_minor": amount, "currency": "USD",
                 "reason_code": "duplicate_charge"},
    })


async def per_call_us(call: Callable[[], Awaitable[Any]], seconds: float) -> float:
    """Mean µs per call over batches of 100 until ``seconds`` have passed."""
    for _ in range(50):  # warm-up
        await call()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(100):
            await call()
        calls += 100
    return elapsed / calls * 1e6


async def main_async(seconds: float) -> None:
    store = PolicyStore([ROOT / "policies", ROOT / "rego"])
    print(f"{'bundle':8} {'effect':17} {'engine µs':>10} {'+catalogue µs':>14} "
          f"{'evals/s':>9}")
    for engine, path in BUNDLES.items():
        if not (path / "manifest.toml").exists():
            print(f"{engine:8} skipped: {path} not found")
            continue
        bundle = store.load_bundle(path)
        for want, amount in AMOUNTS.items():
            doc = refund_input(amount)
            got = (await run_bundle(bundle, doc)).effect
            if got != want:
                raise SystemExit(f"{bundle.id}: amount {amount} gave {got}, want {want}")
            alone = await per_call_us(lambda b=bundle, d=doc: run_bundle(b, d), seconds)
            full = await per_call_us(lambda b=bundle, d=doc: evaluate_case(b, d), seconds)
            print(f"{engine:8} {want:17} {alone:10.1f} {full:14.1f} {1e6 / full:9,.0f}")


def cpu_us(call: Callable[[], Any], rounds: int = 5, n: int = 1000) -> float:
    """Best of ``rounds`` means of ``n`` calls, µs of process CPU time per call."""
    for _ in range(100):
        call()
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(n):
            call()
        best = min(best, (time.process_time() - start) / n * 1e6)
    return best


def fresh(engine: Any, doc: dict[str, Any]) -> Any:
    """One evaluation by rego-cpp: the engine's result memo set aside for the call."""
    memo, engine.memo = engine.memo, None
    try:
        return engine.evaluate_sync(doc)
    finally:
        engine.memo = memo


def rego_parts() -> None:
    from cosigner.policy.rego_input import parse_output, query_entrypoint, set_input

    store = PolicyStore([ROOT / "policies", ROOT / "rego"])
    engine = store.load_bundle(BUNDLES["rego"]).engine
    it, compiled, plan = engine._interpreter, engine._compiled, engine._plan
    keys = engine._keys or frozenset()
    print(f"\n{'rego step (µs CPU)':17} {'project':>8} {'set_input':>10} {'query':>8} "
          f"{'evaluate':>9} {'remembered':>11} {'regopy set':>11} {'regopy query':>13}")
    for want, amount in AMOUNTS.items():
        doc = refund_input(amount)
        sub = {k: doc[k] for k in keys if k in doc}
        set_input(it, sub)
        parts = [
            cpu_us(lambda d=doc: {k: d[k] for k in keys if k in d}),
            cpu_us(lambda s=sub: set_input(it, s)),
            cpu_us(lambda: parse_output(query_entrypoint(it, compiled, plan.encode()) or "")),
            cpu_us(lambda d=doc: fresh(engine, d)),
            cpu_us(lambda d=doc: engine.evaluate_sync(d)),
            cpu_us(lambda s=sub: it.set_input(s)),
            cpu_us(lambda: it.query_bundle_entrypoint(compiled, plan)),
        ]
        widths = (8, 10, 8, 9, 11, 11, 13)
        print(f"{want:17} " + " ".join(f"{x:{w}.1f}" for x, w in zip(parts, widths, strict=True)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="measuring time per row (default 1 s)")
    parser.add_argument("--parts", action="store_true",
                        help="also the embedded Rego engine's steps, µs CPU each")
    args = parser.parse_args()
    asyncio.run(main_async(args.seconds))
    if args.parts:
        rego_parts()
    return 0


if __name__ == "__main__":
    sys.exit(main())
