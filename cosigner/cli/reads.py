"""``cosigner principals list``, ``keys list`` and ``policy list``: what the database
holds, read-only, as a table or (``--json``) one JSON document.

Nothing secret is printed: no API key, secret hash, password hash or private key (only
whether a sealed private key is stored).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cosigner.core.clock import system_clock
from cosigner.core.settings import Settings

if TYPE_CHECKING:  # the database layer is imported when a command runs, not by --help
    from sqlalchemy.ext.asyncio import AsyncConnection


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="print one JSON document instead of a table")


def principals_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", help="only this tenant's principals (default: every tenant)")
    _json_flag(p)


def keys_args(p: argparse.ArgumentParser) -> None:
    _json_flag(p)


def policy_args(p: argparse.ArgumentParser) -> None:
    _json_flag(p)


def _read(settings: Settings, query: Callable[[AsyncConnection], Coroutine[Any, Any, Any]]
          ) -> Any:
    from cosigner.db.database import Database

    async def run() -> Any:
        db = Database(settings.database_url)
        try:
            async with db.read() as conn:
                return await query(conn)
        finally:
            await db.dispose()

    return asyncio.run(run())


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()


def _print(document: dict[str, Any], as_json: bool, header: list[str],
           rows: list[list[Any]], empty: str) -> None:
    if as_json:
        print(json.dumps(document, indent=2, sort_keys=True))
        return
    if not rows:
        print(empty, file=sys.stderr)
        return
    cells = [header] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def list_principals(args: argparse.Namespace, settings: Settings) -> int:
    """Principals (API-key holders and web-form users) with roles and API key ids."""
    from sqlalchemy import select

    from cosigner.db.tables import api_keys, principals

    async def query(conn: AsyncConnection) -> list[dict[str, Any]]:
        where = select(principals).order_by(principals.c.tenant, principals.c.subject)
        if args.tenant:
            where = where.where(principals.c.tenant == args.tenant)
        keys: dict[str, list[dict[str, Any]]] = {}
        for key in (await conn.execute(select(api_keys).order_by(api_keys.c.created_at))):
            keys.setdefault(key.principal_id, []).append({
                "id": key.id, "created_at": _iso(key.created_at),
                "revoked_at": _iso(key.revoked_at)})
        return [{"id": row.id, "tenant": row.tenant, "subject": row.subject,
                 "display_name": row.display_name, "kind": row.kind,
                 "roles": sorted(row.roles), "disabled": bool(row.disabled),
                 "password": row.password_hash is not None,
                 "created_at": _iso(row.created_at), "api_keys": keys.get(row.id, [])}
                for row in await conn.execute(where)]

    found = _read(settings, query)
    rows = [[p["tenant"], p["subject"], p["kind"], ",".join(p["roles"]),
             "disabled" if p["disabled"] else "enabled",
             sum(1 for k in p["api_keys"] if k["revoked_at"] is None)] for p in found]
    _print({"principals": found}, args.json,
           ["TENANT", "SUBJECT", "KIND", "ROLES", "STATE", "ACTIVE_KEYS"], rows,
           "no principals (create one with `cosigner principals add-key`)")
    return 0


def key_state(row: Any, now: datetime) -> str:
    """``signing``, ``next`` (published, signs later), ``retired`` (still published to
    verify what it signed) or ``unpublished``."""
    def at(value: datetime) -> datetime:
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    if row.not_after is not None and at(row.not_after) <= now:
        return "unpublished"
    if row.retired_at is not None and at(row.retired_at) <= now:
        return "retired"
    return "signing" if at(row.activates_at) <= now else "next"


def list_keys(args: argparse.Namespace, settings: Settings) -> int:
    """The permit and checkpoint signing keys in the database, newest first."""
    from sqlalchemy import select

    from cosigner.db.tables_keys import signing_keys

    now = system_clock()

    async def query(conn: AsyncConnection) -> list[dict[str, Any]]:
        rows = await conn.execute(select(signing_keys).order_by(
            signing_keys.c.activates_at.desc(), signing_keys.c.kid))
        return [{"kid": row.kid, "state": key_state(row, now), "alg": row.alg,
                 "created_at": _iso(row.created_at), "activates_at": _iso(row.activates_at),
                 "retired_at": _iso(row.retired_at), "not_after": _iso(row.not_after),
                 "private_key_stored": row.private_sealed is not None} for row in rows]

    found = _read(settings, query)
    rows = [[k["kid"], k["state"], k["activates_at"], k["retired_at"]] for k in found]
    _print({"keys": found}, args.json, ["KID", "STATE", "SIGNS_FROM", "RETIRED_AT"], rows,
           "no signing keys yet (`cosigner serve` or `cosigner keys rotate` creates one)")
    return 0


def list_policy(args: argparse.Namespace, settings: Settings) -> int:
    """Bundles found in ``COSIGNER_BUNDLE_DIRS`` and the versions the database makes
    active and shadow on every replica (what a server started now would serve)."""
    from cosigner.policy.admin import describe_policies
    from cosigner.policy.state import read_state
    from cosigner.policy.store import PolicyStore, engine_factory

    store = PolicyStore(settings.bundle_dirs, managed=True, engine_factory=engine_factory(
        opa_url=settings.opa_url, opa_timeout_ms=settings.opa_timeout_ms))
    store.reload()
    state = _read(settings, read_state)
    document = describe_policies(store.install(state), state=state)
    document["bundle_dirs"] = [str(d) for d in settings.bundle_dirs]
    rows = []
    for bundle in document["bundles"]:
        loaded = {v["version"]: v for v in bundle["versions"]}
        active = loaded.get(bundle["active"] or "", {})
        rows.append([bundle["id"], bundle["active"] or "(none)", bundle["shadow"],
                     ",".join(active.get("tenants", [])) or None, active.get("engine"),
                     ",".join(sorted(loaded))])
    _print(document, args.json, ["BUNDLE", "ACTIVE", "SHADOW", "TENANTS", "ENGINE",
                                 "LOADED"], rows,
           "no policy bundle in " + ", ".join(document["bundle_dirs"]) +
           ": every decision is denied (`cosigner init DIR` writes a starter bundle)")
    for error in document.get("errors", []):
        print(f"not loaded: {error}", file=sys.stderr)
    return 0
