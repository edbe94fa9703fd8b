"""``cosigner-mcp-gate``: put an unmodified stdio MCP server's tool calls behind Cosigner.

    cosigner-mcp-gate --url URL --key-env VAR [--server-name NAME] [--principal ID]
                      [--initiator ID] [--hide-denied] -- <command that starts the server>

It speaks MCP on its own stdin/stdout to the client, starts the server as a child
process, and relays everything (:mod:`.relay`), running each ``tools/call`` through
decide → approval → redeem → forward → report (:mod:`.calls`). Logs go to stderr.

Identity is the gate's: the API key is read from the environment variable named by
``--key-env`` (and withheld from the server's environment), the principal and initiator
come from flags or ``COSIGNER_PRINCIPAL`` / ``COSIGNER_INITIATOR`` (default: the OS user,
and ``mcp-agent``), never from tool arguments. Exit status 2 for a usage error, 1 when
the server cannot be started.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.server.stdio import stdio_server

from cosigner_client.gate import AsyncGate
from cosigner_client.mcp_gate.calls import CallSettings
from cosigner_client.mcp_gate.relay import Relay

log = logging.getLogger("cosigner_client.mcp_gate")


@dataclass(frozen=True)
class GateConfig:
    """Everything a gate session needs. Times in seconds."""

    url: str
    api_key: str = field(repr=False)
    key_env: str
    command: tuple[str, ...]
    principal: str
    initiator: str
    server_name: str | None = None
    hide_denied: bool = False
    timeout: float = 2.0
    approval_timeout: float = 300.0
    progress_interval: float = 5.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cosigner-mcp-gate",
        description="Run an MCP server over stdio with every tools/call decided, approved, "
                    "redeemed and reported by Cosigner.",
        epilog="example: cosigner-mcp-gate --url http://127.0.0.1:8080 --key-env COSIGNER_KEY "
               "--server-name filesystem -- npx -y @modelcontextprotocol/server-filesystem "
               "/srv/mcp")
    p.add_argument("--url", required=True, help="Cosigner base URL")
    p.add_argument("--key-env", default="COSIGNER_KEY", metavar="VAR",
                   help="environment variable holding the runtime API key (default "
                        "COSIGNER_KEY); it is not passed on to the server")
    p.add_argument("--server-name", help="prefix of tool names sent to Cosigner "
                   "(<server>.<tool>); default: the name the server reports at initialize")
    p.add_argument("--principal", default=os.environ.get("COSIGNER_PRINCIPAL"),
                   help="on whose behalf calls run (default $COSIGNER_PRINCIPAL, else the "
                        "OS user)")
    p.add_argument("--initiator", default=os.environ.get("COSIGNER_INITIATOR", "mcp-agent"),
                   help="who proposes the calls (default $COSIGNER_INITIATOR, else mcp-agent)")
    p.add_argument("--hide-denied", action="store_true",
                   help="drop from tools/list the tools the tenant's catalogue denies outright")
    p.add_argument("--timeout", type=float, default=2.0,
                   help="seconds per Cosigner request, retries included (default 2)")
    p.add_argument("--approval-timeout", type=float, default=300.0,
                   help="seconds a call waits for an approval (default 300)")
    p.add_argument("--progress-interval", type=float, default=5.0,
                   help="seconds between progress notifications while waiting (default 5)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- then the command that starts the MCP server")
    return p


def config_from(args: argparse.Namespace, environ: dict[str, str]) -> GateConfig:
    """Validate parsed flags; raises ``SystemExit(2)`` with a message on stderr."""
    command = tuple(args.command[1:] if args.command[:1] == ["--"] else args.command)
    if not command:
        parser().error("give the server's command after --")
    api_key = environ.get(args.key_env, "")
    if not api_key:
        parser().error(f"${args.key_env} is empty: it must hold a Cosigner runtime key")
    for name in ("timeout", "approval_timeout", "progress_interval"):
        if getattr(args, name) <= 0:
            parser().error(f"--{name.replace('_', '-')} must be positive")
    return GateConfig(url=args.url, api_key=api_key, key_env=args.key_env, command=command,
                      principal=args.principal or getpass.getuser(), initiator=args.initiator,
                      server_name=args.server_name, hide_denied=args.hide_denied,
                      timeout=args.timeout, approval_timeout=args.approval_timeout,
                      progress_interval=args.progress_interval)


def server_environment(config: GateConfig, environ: dict[str, str]) -> dict[str, str]:
    """The server's environment: the gate's own, less the Cosigner key."""
    return {k: v for k, v in environ.items() if k != config.key_env}


async def serve(config: GateConfig) -> int:
    """Run one gate session until the client closes stdin; the exit status."""
    run_id = f"mcp-{uuid.uuid4().hex}"
    log.info("gate session run %s → %s as %s/%s", run_id, config.url, config.principal,
             config.initiator)
    params = StdioServerParameters(command=config.command[0], args=list(config.command[1:]),
                                   env=server_environment(config, dict(os.environ)))
    settings = CallSettings(run_id=run_id, approval_timeout=config.approval_timeout,
                            progress_interval=config.progress_interval)
    async with AsyncGate(config.url, config.api_key, timeout=config.timeout,
                         principal={"id": config.principal, "type": "user"},
                         initiator={"id": config.initiator, "type": "agent"},
                         run=run_id) as gate, stdio_server() as (from_client, to_client):
        try:
            async with stdio_client(params) as (from_server, to_server):
                relay = Relay(gate=gate, settings=settings, hide_denied=config.hide_denied,
                              to_client=to_client, to_server=to_server,
                              server_name=config.server_name)
                await relay.run(from_client, from_server)
        except OSError as exc:
            log.error("cannot start the MCP server %r: %s", config.command[0], exc)
            return 1
        finally:
            await to_client.aclose()  # ends stdio_server's writer, so the gate can exit
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    config = config_from(args, dict(os.environ))
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="cosigner-mcp-gate %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return anyio.run(serve, config)
