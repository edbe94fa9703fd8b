"""``cosigner audit export | verify | prune | checkpoint`` (registered in ``cosigner.cli.main``).

``verify`` works offline: it needs only the export file and a JWKS (a file, or a URL such as
``https://cosigner.example/.well-known/jwks.json``). Exit codes: 0 intact, 1 a fault was
found (the report names the first bad seq and the fault kind), 2 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cosigner.core.clock import isoformat, system_clock
from cosigner.core.settings import Settings

CLI_ACTOR: dict[str, Any] = {"subject": "cli", "principal_id": None, "kind": "cli"}


def _when(text: str) -> datetime:
    """An RFC 3339 time or a date (midnight UTC); naive values are UTC."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a date or RFC 3339 time: {text!r}") from exc
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", required=True, help="tenant id")
    p.add_argument("--format", choices=["jsonl", "csv"], default="jsonl",
                   help="JSON Lines (verifiable) or CSV (default jsonl)")
    p.add_argument("--since", type=_when, help="inclusive, RFC 3339 or YYYY-MM-DD (UTC)")
    p.add_argument("--until", type=_when, help="exclusive, RFC 3339 or YYYY-MM-DD (UTC)")
    p.add_argument("--out", required=True, help="output file ('-' for stdout)")


def export_cmd(args: argparse.Namespace, settings: Settings) -> int:
    from cosigner.audit.export import export
    from cosigner.db.database import Database
    from cosigner.keys.store import open_keyring

    async def run() -> None:
        db = Database(settings.database_url)
        _, keyring = await open_keyring(db, settings, now=system_clock())
        out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")  # noqa: SIM115
        try:
            chunks = await export(db, keyring, tenant=args.tenant, fmt=args.format,
                                  since=args.since, until=args.until, now=system_clock())
            async for chunk in chunks:
                out.write(chunk)
        finally:
            if out is not sys.stdout:
                out.close()
            await db.dispose()

    asyncio.run(run())
    return 0


def verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a JSON Lines export")
    p.add_argument("--jwks", required=True, help="JWKS file or URL (…/.well-known/jwks.json)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def load_jwks(source: str) -> dict[str, Any]:
    """A JWK Set from a file or an http(s) URL."""
    if source.startswith(("http://", "https://")):
        import httpx

        response = httpx.get(source, timeout=10)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data
    loaded: dict[str, Any] = json.loads(Path(source).read_text(encoding="utf-8"))
    return loaded


def verify_cmd(args: argparse.Namespace, _: Settings) -> int:
    from cosigner.audit.verify import verify_export

    path = Path(args.file)

    def lines() -> Iterator[str]:
        with path.open(encoding="utf-8") as handle:
            yield from handle

    report = verify_export(lines, load_jwks(args.jwks))
    if args.json:
        print(json.dumps(report.as_dict()))
    elif report.ok:
        print(f"ok: {report.events} events (seq {report.first_seq}..{report.last_seq}), "
              f"{report.checkpoints} signed checkpoints")
    else:
        print(f"FAULT {report.fault} at seq {report.bad_seq}: {report.detail}")
    return 0 if report.ok else 1


def prune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", required=True, help="tenant id")
    p.add_argument("--before", required=True, type=_when,
                   help="drop events up to the latest checkpoint signed before this time")


def prune_cmd(args: argparse.Namespace, settings: Settings) -> int:
    from cosigner.audit.prune import prune
    from cosigner.db.database import Database

    async def run() -> Any:
        db = Database(settings.database_url)
        try:
            return await prune(db, tenant=args.tenant, before=args.before, now=system_clock(),
                               actor=CLI_ACTOR)
        finally:
            await db.dispose()

    result = asyncio.run(run())
    if result.anchor_seq is None:
        print(f"no checkpoint signed before {isoformat(args.before)}; nothing pruned")
    else:
        print(f"pruned {result.deleted} events; anchor is checkpoint seq {result.anchor_seq} "
              f"({result.anchor_hash})")
    return 0


def checkpoint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", required=True, help="tenant id")


def checkpoint_cmd(args: argparse.Namespace, settings: Settings) -> int:
    from cosigner.audit.checkpoints import checkpoint_now
    from cosigner.db.database import Database
    from cosigner.keys.store import open_keyring

    async def run() -> Any:
        db = Database(settings.database_url)
        try:
            _, keyring = await open_keyring(db, settings, now=system_clock())
            return await checkpoint_now(db, keyring, tenant=args.tenant, now=system_clock())
        finally:
            await db.dispose()

    checkpoint = asyncio.run(run())
    print(json.dumps(checkpoint.as_dict() if checkpoint else None))
    return 0


def record_rotation(settings: Settings, *, old_kid: str, new_kid: str) -> None:
    """Record ``key.rotated`` in the system chain; a failure is reported, not fatal
    (the rotation itself is already committed)."""
    from cosigner.audit.system import record_key_rotated
    from cosigner.core.errors import CosignerError
    from cosigner.db.database import Database

    async def run() -> None:
        db = Database(settings.database_url)
        try:
            await record_key_rotated(db, old_kid=old_kid, new_kid=new_kid, now=system_clock(),
                                     actor=CLI_ACTOR)
        finally:
            await db.dispose()

    try:
        asyncio.run(run())
    except CosignerError as exc:
        print(f"warning: key.rotated not recorded in the decision log: {exc.detail}",
              file=sys.stderr)
