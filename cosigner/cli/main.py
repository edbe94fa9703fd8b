"""``cosigner`` command line: serve, migrate, principals, keys (more subcommands are
registered by their areas through :data:`COMMANDS`).

Every subcommand reads settings from the environment (``COSIGNER_*``) like the server.
Exit codes: 0 success, 1 failure of what was asked, 2 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from cosigner.core import logs
from cosigner.core.clock import system_clock
from cosigner.core.settings import Settings, get_settings, parse_forwarded_allow_ips

#: name → (configure parser, run(args, settings) -> exit code, one-line help)
Command = tuple[Callable[[argparse.ArgumentParser], None],
                Callable[[argparse.Namespace, Settings], int], str]

#: one-line help of each command group (``principals``, ``keys``, ...)
GROUPS: dict[str, str] = {
    "principals": "manage API keys and web-form users of a tenant",
    "keys": "manage the permit and checkpoint signing keys",
    "policy": "test policy bundles offline, or reload them on a server",
    "audit": "export, verify, prune and checkpoint the audit log",
}


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8080, help="port to listen on")
    p.add_argument("--no-migrate", action="store_true",
                   help="do not apply migrations first (run `cosigner migrate` yourself); "
                        "refuse to start unless the database is at head")
    p.add_argument("--forwarded-allow-ips", metavar="IPS",
                   help="comma-separated proxy addresses or networks whose X-Forwarded-For/"
                        "-Proto/-Host count (default: COSIGNER_FORWARDED_ALLOW_IPS, or none "
                        "- not even loopback)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="worker processes (PostgreSQL only; SQLite serves from one process). "
                        "Metrics are summed over workers (prometheus-client multiprocess "
                        "mode, folder PROMETHEUS_MULTIPROC_DIR or a temporary one)")
    p.add_argument("--log-format", choices=("json", "plain"),
                   help="log lines as JSON objects or plain text (default: "
                        "COSIGNER_LOG_FORMAT, or json)")
    p.add_argument("--access-log", action="store_true", default=None,
                   help="one log line per HTTP request (default: COSIGNER_ACCESS_LOG)")
    p.add_argument("--demo-tenant", metavar="TENANT",
                   help="create runtime/admin/auditor keys for TENANT if it has none, "
                        "and print them once")


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from cosigner.app import create_app

    if args.forwarded_allow_ips is not None:
        try:
            trusted = parse_forwarded_allow_ips(args.forwarded_allow_ips)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        settings = settings.model_copy(update={"forwarded_allow_ips": trusted})
        os.environ["COSIGNER_FORWARDED_ALLOW_IPS"] = ",".join(trusted)  # for --workers
    if args.log_format is not None:
        settings = settings.model_copy(update={"log_format": args.log_format})
        os.environ["COSIGNER_LOG_FORMAT"] = args.log_format
    if args.access_log:
        settings = settings.model_copy(update={"access_log": True})
        os.environ["COSIGNER_ACCESS_LOG"] = "true"
    if args.workers < 1:
        print("error: --workers must be at least 1", file=sys.stderr)
        return 2
    if args.workers > 1 and not settings.database_url.startswith("postgresql"):
        print("error: --workers > 1 needs PostgreSQL; SQLite serves from one process",
              file=sys.stderr)
        return 2
    logs.configure(level=settings.log_level, fmt=settings.log_format)
    problem = _in_child(_migration_problem, settings.database_url, args.no_migrate)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    if args.demo_tenant:
        asyncio.run(_bootstrap_demo(settings, args.demo_tenant))
    listen = f"http://{args.host}:{args.port}"
    common = uvicorn_options(args.host, args.port, settings)
    if args.workers == 1:
        app = create_app(settings)
        app.state.listen = listen
        return _run_server(uvicorn.Server(uvicorn.Config(app, **common)))
    os.environ["COSIGNER_SERVE_LISTEN"] = listen
    # Every worker's counters and histograms in memory-mapped files that /metrics sums
    # (prometheus-client multiprocess mode). The folder must start empty for each run.
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        os.makedirs(folder, exist_ok=True)
    else:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="cosigner-metrics-")
    uvicorn.run("cosigner.cli.main:worker_app", factory=True, workers=args.workers, **common)
    return 0


def uvicorn_options(host: str, port: int, settings: Settings) -> dict[str, Any]:
    """The ``uvicorn.Config`` keyword arguments of ``cosigner serve``."""
    # Proxy headers are the app's job (cosigner.http.proxies, from settings.forwarded_allow_ips):
    # uvicorn's own handling is off, or it would trust 127.0.0.1 (its default) on its own.
    # Logging is ours (cosigner.core.logs): log_config=None keeps uvicorn from replacing it.
    # No WebSocket route exists: ws="none" keeps uvicorn from loading the websockets
    # protocol (~0.6 MB resident, issue 20); an upgrade request is answered as plain HTTP.
    # A response's head and body leave in one write (cosigner.http.coalesce) where
    # httptools is installed; elsewhere uvicorn's own choice.
    return {"host": host, "port": port, "log_level": settings.log_level, "access_log": False,
            "proxy_headers": False, "log_config": None, "ws": "none",
            "http": http_protocol()}


def http_protocol() -> str:
    """uvicorn's ``http`` option: :data:`cosigner.http.coalesce.PROTOCOL` when httptools
    can be imported, else ``"auto"`` (uvicorn then picks h11)."""
    import importlib.util

    if importlib.util.find_spec("httptools") is None:
        return "auto"
    return "cosigner.http.coalesce:CoalescingHttpToolsProtocol"


def _run_server(server: Any) -> int:
    """What ``uvicorn.run`` does for one process without reload: run ``server`` until it
    stops (Ctrl-C is a normal stop); exit 3 (uvicorn's startup failure) when it never
    started. ``uvicorn.run`` itself lives in ``uvicorn.main``, which imports uvicorn's
    command line and reload supervisor (click, watchfiles: ~1.2 MB) that serving never
    uses (issue 20, idle memory; :mod:`cosigner.core.lean_imports`)."""
    from uvicorn.config import STARTUP_FAILURE

    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)
    return 0


def worker_app() -> Any:
    """The app of one ``cosigner serve --workers N`` worker process (settings, logging and
    the metrics folder come from the environment the parent set)."""
    from cosigner.app import create_app

    settings = get_settings()
    logs.configure(level=settings.log_level, fmt=settings.log_format)
    app = create_app(settings)
    app.state.listen = os.environ.get("COSIGNER_SERVE_LISTEN")
    return app


async def _bootstrap_demo(settings: Settings, tenant: str) -> None:
    from sqlalchemy import func, select

    from cosigner.db.database import Database
    from cosigner.db.tables import principals
    from cosigner.identity.principals import create_api_key

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
    problem = _migration_problem(settings.database_url, check_only=False)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    print("database is up to date", file=sys.stderr)
    return 0


def _migration_problem(url: str, check_only: bool) -> str | None:
    """Migrate the database (or, ``check_only``, check that it is at head): ``None``, or
    the error line ``serve`` prints before exiting 1."""
    from cosigner.db.migrate import MigrationStopped, pending_message_blocking, upgrade_blocking

    if check_only:
        problem = pending_message_blocking(url)
        return None if problem is None else f"error: not starting with --no-migrate: {problem}"
    try:
        upgrade_blocking(url)
    except MigrationStopped as exc:  # a refusing revision changed nothing: a message, no trace
        return f"error: migration stopped: {exc}"
    return None


def _in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a forked child process, its result or exception passed back: what
    it imports stays out of this process (Alembic and Mako, ~8 MB of a serving process
    that never migrates again)."""
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


def _add_key_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", required=True, help="tenant id")
    p.add_argument("--role", action="append", required=True,
                   help="runtime, auditor, admin, breakglass, or an approver role such as finance; "
                        "repeatable; in the tenant _system only operator")
    p.add_argument("--subject", help="stable subject id (default: a generated one)")


def _add_key(args: argparse.Namespace, settings: Settings) -> int:
    from cosigner.db.database import Database
    from cosigner.identity.principals import create_api_key

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
    """Rotate the shared signing key in the database; serving replicas follow it."""
    from cosigner.db.database import Database
    from cosigner.keys.store import open_keyring

    async def run() -> Any:
        db = Database(settings.database_url)
        try:
            store, _ = await open_keyring(db, settings, now=system_clock())
            return await store.rotate(now=system_clock())
        finally:
            await db.dispose()

    rotation = asyncio.run(run())
    print(rotation.new_kid)
    print(f"published now; signs from {rotation.activates_at.isoformat()} on every replica "
          f"(they reload within {settings.replica_poll_s} s; no restart needed)",
          file=sys.stderr)
    from cosigner.cli import audit as cli_audit

    cli_audit.record_rotation(settings, old_kid=rotation.old_kid, new_kid=rotation.new_kid)
    return 0


def _noargs(_: argparse.ArgumentParser) -> None:
    return None


def _in(module: str, name: str) -> Callable[..., Any]:
    """``cosigner.cli.<module>.<name>``, imported when first called: a process runs one
    command, and ``cosigner serve`` never imports the others' modules (idle memory)."""

    def call(*args: Any) -> Any:
        return getattr(importlib.import_module(f"cosigner.cli.{module}"), name)(*args)

    call.__name__ = call.__qualname__ = name
    return call


COMMANDS: dict[str, Command] = {
    "serve": (_serve_args, _serve,
              "migrate the database (under a lock) and serve the HTTP API"),
    "init": (_in("init", "init_args"), _in("init", "init_cmd"),
             "write a starter policy bundle (catalogue, rules, golden cases) to DIR"),
    "migrate": (_noargs, _migrate,
                "upgrade the database to this version's schema (under a lock), then exit"),
    "principals add-key": (_add_key_args, _add_key,
                           "create an API key for a tenant and print it once"),
    "principals add-user": (_in("accounts", "add_user_args"), _in("accounts", "add_user"),
                            "create or update a web-form user (approver) with a password"),
    "principals list": (_in("reads", "principals_args"), _in("reads", "list_principals"),
                        "list principals with their roles and API key ids (never a key)"),
    "principals disable": (_in("accounts", "disable_args"), _in("accounts", "disable"),
                           "disable a principal: sign-in refused, sessions ended, "
                           "API keys revoked"),
    "keys rotate": (_noargs, _keys_rotate,
                    "start signing with a new key; old keys stay in the JWKS"),
    "keys list": (_in("reads", "keys_args"), _in("reads", "list_keys"),
                  "list the signing keys: which signs now, which are next or retired"),
    "policy test": (_in("policy", "test_args"), _in("policy", "run_test"),
                    "run the golden cases of policy bundles offline"),
    "policy list": (_in("reads", "policy_args"), _in("reads", "list_policy"),
                    "list bundles on disk and which version is active or shadow where"),
    "policy reload": (_in("policy", "reload_args"), _in("policy", "run_reload"),
                      "ask a running server to reload its policy bundles"),
    "policy replay": (_in("policy", "replay_args"), _in("policy", "run_replay"),
                      "evaluate a candidate bundle on a tenant's logged decisions"),
    "audit export": (_in("audit", "export_args"), _in("audit", "export_cmd"),
                     "write a tenant's audit events as JSON Lines or CSV"),
    "audit verify": (_in("audit", "verify_args"), _in("audit", "verify_cmd"),
                     "check an export's hash chain and signed checkpoints offline"),
    "audit prune": (_in("audit", "prune_args"), _in("audit", "prune_cmd"),
                    "drop old audit events up to a signed checkpoint"),
    "audit checkpoint": (_in("audit", "checkpoint_args"), _in("audit", "checkpoint_cmd"),
                         "sign a checkpoint of a tenant's audit chain now"),
    "demo": (_in("demo", "demo_args"), _in("demo", "demo_cmd"),
             "play the refund story end to end on a temporary server"),
}


def package_version() -> str:
    """The installed distribution's version (``cosigner --version``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cosigner")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line. With ``argv``, only the command it names gets its own
    arguments (the others are listed with their help, as always, but their modules stay
    unimported); without, every command does."""
    chosen = _chosen(argv)
    parser = argparse.ArgumentParser(
        prog="cosigner",
        description="Cosigner: policy decisions and human approvals for AI-agent tool calls. "
                    "Settings come from COSIGNER_* environment variables.")
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {package_version()}",
                        help="print the version and exit")
    groups: dict[str, Any] = {}
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (configure, run, help_text) in COMMANDS.items():
        head, _, tail = name.partition(" ")
        if tail:
            if head not in groups:
                group = top.add_parser(head, help=GROUPS[head], description=GROUPS[head])
                groups[head] = group.add_subparsers(dest="sub", required=True,
                                                    metavar="SUBCOMMAND")
            sub = groups[head].add_parser(tail, help=help_text, description=help_text)
        else:
            sub = top.add_parser(head, help=help_text, description=help_text)
        if chosen is None or name == chosen:
            configure(sub)
        sub.set_defaults(run=run)
    return parser


def _chosen(argv: list[str] | None) -> str | None:
    """The :data:`COMMANDS` name ``argv`` selects (the top level has only ``--help`` and
    ``--version``, which take no value), or ``None`` (then every command is configured)."""
    if argv is None:
        return None
    words = [word for word in argv if not word.startswith("-")][:2]
    for name in (" ".join(words), words[0] if words else ""):
        if name in COMMANDS:
            return name
    return None


def main(argv: list[str] | None = None) -> int:
    from cosigner.core import errors

    if argv is None:
        argv = sys.argv[1:]
    args = build_parser(argv).parse_args(argv)
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
