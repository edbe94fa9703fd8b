"""``cosigner policy test PATH...``, ``cosigner policy reload`` and ``cosigner policy replay``.

``policy test`` works like ``opa test``: it loads each bundle folder (or every bundle
folder under a directory), runs its golden cases and, for Rego bundles, its ``test_``
rules, prints one PASS/FAIL line each and a summary, and exits 1 on any failure or on a
bundle that does not load. It never reports success for tests that did not run: a
``cases.yaml`` the manifest does not name, an ``engine = "opa"`` bundle without cases (its
rules live in OPA, so its cases are its only tests), and a run with no test at all are
failures. An OPA bundle's cases are evaluated by the OPA at ``--opa-url`` (default
``COSIGNER_OPA_URL``); when that OPA cannot be reached the command says so and exits 1.

``policy reload`` asks a running server to reload from disk
(``POST /v1/policies/reload`` with a system operator's API key: role ``operator`` in the
tenant ``_system``, made with ``cosigner principals add-key --tenant _system --role
operator``). ``policy replay CANDIDATE_DIR --tenant T`` evaluates a bundle folder on the
tenant's logged decisions straight from the database (:mod:`cosigner.policy.replay`),
prints the report as JSON and records one ``policy.replayed`` event.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from cosigner.core.errors import CosignerError, Unavailable
from cosigner.core.settings import Settings


def test_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="a bundle folder (with manifest.toml) or a folder of bundles",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print passing lines too")
    p.add_argument("--opa-url", help="OPA that evaluates engine = \"opa\" bundles' cases "
                                     "(default: COSIGNER_OPA_URL)")
    p.add_argument("--opa-timeout-ms", type=int,
                   help="per-case OPA timeout (default: COSIGNER_OPA_TIMEOUT_MS)")


def _bundle_dirs(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if (path / "manifest.toml").is_file():
            found.append(path)
        else:
            found.extend(sorted(m.parent for m in path.glob("*/manifest.toml")))
            if not any(path.glob("*/manifest.toml")):
                found.append(path)  # reported as "manifest.toml: missing"
    return found


#: A case file that is not run unless the manifest names it.
CASES_FILE = "cases.yaml"


def _not_run(bundle: Any, report: Any, opa_url: str) -> list[str]:
    """Why tests this bundle holds did not run (each one a failure), see module doc."""
    problems = []
    if bundle.manifest.cases is None and CASES_FILE in bundle.files:
        problems.append(f"{CASES_FILE} is not named in manifest.toml (add "
                        f'cases = "{CASES_FILE}"): its cases did not run')
    elif bundle.manifest.engine == "opa" and not report.cases:
        problems.append("an engine = \"opa\" bundle's rules live in OPA: give it cases "
                        f"(cases = \"{CASES_FILE}\") to run against the OPA at {opa_url}")
    down = [r for r in report.cases
            if any(reason.code == "engine_unavailable" for reason in r.got.reasons)]
    if down:
        problems.append(f"OPA at {opa_url} did not answer {len(down)} case(s): start it, or "
                        "point --opa-url (COSIGNER_OPA_URL) at the OPA serving this policy")
    return problems


async def _test_one(path: Path, settings: Settings, verbose: bool,
                    opa_url: str, opa_timeout_ms: int) -> tuple[int, int]:
    from cosigner.policy.cases import test_bundle
    from cosigner.policy.store import PolicyStore, engine_factory

    store = PolicyStore(
        [],
        engine_factory=engine_factory(opa_url=opa_url, opa_timeout_ms=opa_timeout_ms),
    )
    try:
        bundle = store.load_bundle(path)
        report = await test_bundle(bundle)
    except CosignerError as exc:
        print(f"ERROR {path}: {exc.detail}")
        return 0, 1
    print(
        f"{path} ({bundle.id} {bundle.version}, {bundle.manifest.engine}, {bundle.revision[:19]})"
    )
    lines: list[tuple[bool, str, str]] = [
        (r.passed, r.case.description, r.message) for r in report.cases
    ]
    lines += [(t.passed, t.name, t.message) for t in report.rego_tests]
    lines += [(False, "not run", problem) for problem in _not_run(bundle, report, opa_url)]
    for passed, name, message in lines:
        if not passed:
            print(f"  FAIL  {name}: {message}")
        elif verbose:
            print(f"  PASS  {name}")
    close = getattr(bundle.engine, "close", None)
    if close is not None:
        await close()
    passed_count = sum(1 for ok, _, _ in lines if ok)
    return passed_count, len(lines) - passed_count


def run_test(args: argparse.Namespace, settings: Settings) -> int:
    """Run every named bundle's tests; exit 1 on a failure, a bundle that fails to load,
    tests that did not run, or no test at all."""
    opa_url = getattr(args, "opa_url", None) or settings.opa_url
    opa_timeout_ms = getattr(args, "opa_timeout_ms", None) or settings.opa_timeout_ms

    async def run() -> tuple[int, int]:
        passed = failed = 0
        for path in _bundle_dirs(args.paths):
            p, f = await _test_one(path, settings, args.verbose, opa_url, opa_timeout_ms)
            passed, failed = passed + p, failed + f
        return passed, failed

    passed, failed = asyncio.run(run())
    print(f"{passed} passed, {failed} failed")
    if passed + failed == 0:
        print("error: no tests ran", file=sys.stderr)
        return 1
    return 1 if failed else 0


def reload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="server base URL (default: COSIGNER_PUBLIC_URL)")
    p.add_argument(
        "--api-key-env",
        default="COSIGNER_API_KEY",
        help="environment variable holding an operator API key (default COSIGNER_API_KEY)",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait")


def run_reload(args: argparse.Namespace, settings: Settings) -> int:
    """Ask the server to reload its bundles; exit 1 if any bundle was refused."""
    import httpx

    key = os.environ.get(args.api_key_env, "")
    if not key:
        print(f"error: set {args.api_key_env} to an operator API key", file=sys.stderr)
        return 2
    url = (args.url or settings.public_url).rstrip("/") + "/v1/policies/reload"
    try:
        response = httpx.post(url, headers={"Authorization": f"Bearer {key}"}, timeout=args.timeout)
    except httpx.HTTPError as exc:
        raise Unavailable(
            f"cannot reach {url}: {type(exc).__name__}", code="server_unavailable"
        ) from exc
    body: Any = response.json() if response.content else {}
    if response.status_code != 200:
        print(
            f"error: HTTP {response.status_code}: {body.get('code')}: {body.get('detail')}",
            file=sys.stderr,
        )
        return 1
    for bundle in body["bundles"]:
        print(
            f"{bundle['id']}: active {bundle['active']}"
            + (f", shadow {bundle['shadow']}" if bundle["shadow"] else "")
        )
    for error in body["errors"]:
        print(f"REFUSED {error['path']}: {error['message']}")
    return 1 if body["errors"] else 0


def replay_args(p: argparse.ArgumentParser) -> None:
    from cosigner.cli.audit import _when

    p.add_argument("candidate", type=Path, metavar="CANDIDATE_DIR",
                   help="the candidate bundle folder (with manifest.toml)")
    p.add_argument("--tenant", required=True, help="whose decision log to replay")
    p.add_argument("--since", type=_when, help="inclusive, RFC 3339 or YYYY-MM-DD (UTC)")
    p.add_argument("--until", type=_when, help="exclusive, RFC 3339 or YYYY-MM-DD (UTC)")


def run_replay(args: argparse.Namespace, settings: Settings) -> int:
    """Replay the candidate and print the report (JSON); exit 1 if it does not load."""
    import json

    from cosigner.cli.audit import CLI_ACTOR
    from cosigner.core.clock import system_clock
    from cosigner.db.database import Database
    from cosigner.policy import replay
    from cosigner.policy.store import PolicyStore, engine_factory

    store = PolicyStore([], engine_factory=engine_factory(
        opa_url=settings.opa_url, opa_timeout_ms=settings.opa_timeout_ms))
    try:
        bundle = store.load_bundle(args.candidate)
    except CosignerError as exc:
        print(f"error: {args.candidate}: {exc.detail}", file=sys.stderr)
        return 1

    async def run() -> dict[str, Any]:
        db = Database(settings.database_url)
        try:
            report = await replay.replay(db, bundle, tenant=args.tenant, since=args.since,
                                         until=args.until)
            result = replay.summary(bundle, report, tenant=args.tenant, since=args.since,
                                    until=args.until)
            await replay.record_replay(db, actor=CLI_ACTOR, now=system_clock(),
                                       result=result)
            return result
        finally:
            close = getattr(bundle.engine, "close", None)
            if close is not None:
                await close()
            await db.dispose()

    print(json.dumps(asyncio.run(run()), indent=2))
    return 0
