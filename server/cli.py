"""``cosigner`` command line: serve, migrate, principals, keys (more subcommands are
registered by their areas through :data:`COMMANDS`).

Every subcommand reads settings from the environment (``COSIGNER_*``) like the server.
Exit codes: 0 success, 1 failure of what was asked, 2 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

from server import accounts_cli, cli_audit, demo, policy_cli
from server.clock import system_clock
from server.settings import Settings, get_settings

#: name → (configure parser, run(args, settings) -> exit code)
Command = tuple[Callable[[argparse.ArgumentParser], None],
                Callable[[argparse.Namespace, Settings], int]]


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--no-migrate", action="store_true", help="do not apply migrations first")
    p.add_argument("--demo-tenant", metavar="TENANT",
                   help="create runtime/admin/auditor keys for TENANT if it has none, "
                        "and print them once")


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from server.app import create_app
    from server.db.migrate import upgrade_blocking

    if not args.no_migrate:
        upgrade_blocking(settings.database_url)
    if args.demo_tenant:
        asyncio.run(_bootstrap_demo(settings, args.demo_tenant))
    uvicorn.run(create_app(settings), host=args.host, port=args.port,
                log_level=settings.log_level, access_log=False)
    return 0


async def _bootstrap_demo(settings: Settings, tenant: str) -> None:
    from sqlalchemy import func, select

    from server.db.database import Database
    from server.db.tables import principals
    from server.principals import create_api_key

    db = Database(settings.database_url)
    try:
        async with db.read() as conn:
            count = (await conn.execute(select(func.count()).select_from(principals)
                                        .where(principals.c.tenant == tenant))).scalar_one()
        if count:
            print(f"tenant {tenant!r} already has principals; no new demo keys "
                  "(create more with `cosigner principals add-key`)", file=sys.stderr)
            return
        print(f"Demo tenant {tenant!r} created. These keys are shown once:", file=sys.stderr)
        for role in ("runtime", "admin", "auditor"):
            key, _ = await create_api_key(db, tenant=tenant, roles=[role],
                                          subject=f"demo-{role}", clock=system_clock)
            print(f"  {role:8} {key}", file=sys.stderr)
    finally:
        await db.dispose()


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    from server.db.migrate import upgrade_blocking

    upgrade_blocking(settings.database_url)
    print("database is up to date", file=sys.stderr)
    return 0


def _add_key_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", required=True)
    p.add_argument("--role", action="append", required=True,
                   help="runtime, auditor, admin, or an approver role such as finance; "
                        "repeatable; in the tenant _system only operator")
    p.add_argument("--subject", help="stable subject id (default: a generated one)")


def _add_key(args: argparse.Namespace, settings: Settings) -> int:
    from server.db.database import Database
    from server.principals import create_api_key

    async def run() -> str:
        db = Database(settings.database_url)
        try:
            key, _ = await create_api_key(db, tenant=args.tenant, roles=args.role,
                                          subject=args.subject, clock=system_clock)
            return key
        finally:
            await db.dispose()

    print(asyncio.run(run()))
    return 0


def _keys_rotate(args: argparse.Namespace, settings: Settings) -> int:
    from server.keys import Keyring

    keyring = Keyring.load_or_create(settings.key_dir, now=system_clock(),
                                     max_token_lifetime_s=settings.max_permit_ttl_s)
    old_kid = keyring.current_kid
    new_kid = keyring.rotate(now=system_clock())
    print(new_kid)
    print("restart serving processes to sign with the new key", file=sys.stderr)
    cli_audit.record_rotation(settings, old_kid=old_kid, new_kid=new_kid)
    return 0


def _noargs(_: argparse.ArgumentParser) -> None:
    return None


COMMANDS: dict[str, Command] = {
    "serve": (_serve_args, _serve),
    "migrate": (_noargs, _migrate),
    "principals add-key": (_add_key_args, _add_key),
    "principals add-user": (accounts_cli.add_user_args, accounts_cli.add_user),
    "principals disable": (accounts_cli.disable_args, accounts_cli.disable),
    "keys rotate": (_noargs, _keys_rotate),
    "policy test": (policy_cli.test_args, policy_cli.run_test),
    "policy reload": (policy_cli.reload_args, policy_cli.run_reload),
    "audit export": (cli_audit.export_args, cli_audit.export_cmd),
    "audit verify": (cli_audit.verify_args, cli_audit.verify_cmd),
    "audit prune": (cli_audit.prune_args, cli_audit.prune_cmd),
    "audit checkpoint": (cli_audit.checkpoint_args, cli_audit.checkpoint_cmd),
    "demo": (demo.demo_args, demo.demo_cmd),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cosigner", description=__doc__.splitlines()[0])
    groups: dict[str, Any] = {}
    top = parser.add_subparsers(dest="command", required=True)
    for name, (configure, run) in COMMANDS.items():
        head, _, tail = name.partition(" ")
        if tail:
            if head not in groups:
                groups[head] = top.add_parser(head).add_subparsers(dest="sub", required=True)
            sub = groups[head].add_parser(tail)
        else:
            sub = top.add_parser(head)
        configure(sub)
        sub.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from server import errors

    args = build_parser().parse_args(argv)
    settings = get_settings()
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        code: int = args.run(args, settings)
    except errors.CosignerError as exc:
        print(f"error: {exc.code}: {exc.detail}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
