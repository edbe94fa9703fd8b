"""``cosigner principals add-user`` and ``cosigner principals disable``."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys

from cosigner.core.clock import system_clock
from cosigner.core.errors import InvalidRequest
from cosigner.core.settings import Settings


def add_user_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="stable subject id of the person (e.g. alice@example.com)")
    p.add_argument("--tenant", required=True, help="tenant id")
    p.add_argument("--role", action="append", required=True,
                   help="approver role such as finance, or breakglass (repeatable)")
    p.add_argument("--password-stdin", action="store_true",
                   help="read the password from the first line of stdin instead of a prompt")


def _read_password(from_stdin: bool) -> str:
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass("Password: ")
    if getpass.getpass("Repeat password: ") != first:
        raise InvalidRequest("the passwords differ", code="password_mismatch")
    return first


def add_user(args: argparse.Namespace, settings: Settings) -> int:
    """Create (or update) a web approver with a password; prints its principal id."""
    from cosigner.db.database import Database
    from cosigner.identity import accounts

    password = _read_password(args.password_stdin)

    async def run() -> str:
        db = Database(settings.database_url)
        try:
            return await accounts.add_user(db, tenant=args.tenant, name=args.name,
                                           roles=args.role, password=password,
                                           clock=system_clock)
        finally:
            await db.dispose()

    print(asyncio.run(run()))
    print(f"{args.name} can sign in at {settings.public_url.rstrip('/')}/ui/login"
          f"?tenant={args.tenant}", file=sys.stderr)
    return 0


def disable_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="subject id of the user or API-key principal")
    p.add_argument("--tenant", required=True, help="tenant id")


def disable(args: argparse.Namespace, settings: Settings) -> int:
    """Disable a principal: sign-in refused, sessions ended, API keys revoked."""
    from cosigner.db.database import Database
    from cosigner.identity import accounts

    async def run() -> dict[str, int]:
        db = Database(settings.database_url)
        try:
            return await accounts.disable_principal(db, tenant=args.tenant, name=args.name,
                                                    clock=system_clock)
        finally:
            await db.dispose()

    ended = asyncio.run(run())
    print(f"disabled {args.name}: {ended['sessions']} session(s) ended, "
          f"{ended['api_keys']} API key(s) revoked", file=sys.stderr)
    return 0
