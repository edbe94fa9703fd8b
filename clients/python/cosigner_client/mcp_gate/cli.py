"""``cosigner-mcp-gate``: put an unmodified MCP server's tool calls behind Cosigner.

    cosigner-mcp-gate --url URL --key-env VAR [--server-name NAME] [--principal ID]
                      [--initiator ID] [--hide-denied] [--listen HOST:PORT]
                      (--upstream URL | -- <command that starts the server>)

The server is a child process on stdio (``-- command``) or a remote server speaking
Streamable HTTP (``--upstream URL``). The gate speaks MCP to its client on its own
stdin/stdout, or with ``--listen`` serves Streamable HTTP at ``http://HOST:PORT/mcp``
(:mod:`.http`; one relay, server connection and run per client session). It relays
everything (:mod:`.relay`), running each ``tools/call`` through decide → approval →
redeem → forward → report (:mod:`.calls`). Logs go to stderr.

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
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.server.stdio import stdio_server

from cosigner_client.gate import AsyncGate
from cosigner_client.mcp_gate.calls import CallSettings
from cosigner_client.mcp_gate.http import HttpFront, Streams, security_for, upstream_http
from cosigner_client.mcp_gate.relay import Relay

log = logging.getLogger("cosigner_client.mcp_gate")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


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
    upstream: str | None = None
    listen: tuple[str, int] | None = None
    listen_token: str | None = field(default=None, repr=False)


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
    p.add_argument("--upstream", metavar="URL",
                   help="a remote MCP server's Streamable HTTP endpoint (instead of a command)")
    p.add_argument("--listen", metavar="HOST:PORT",
                   help="serve MCP Streamable HTTP at http://HOST:PORT/mcp instead of stdio")
    p.add_argument("--listen-token-env", metavar="VAR",
                   help="with --listen: environment variable holding a token clients must "
                        "send as 'Authorization: Bearer <token>'")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- then the command that starts the MCP server")
    return p


def config_from(args: argparse.Namespace, environ: dict[str, str]) -> GateConfig:
    """Validate parsed flags; raises ``SystemExit(2)`` with a message on stderr."""
    command = tuple(args.command[1:] if args.command[:1] == ["--"] else args.command)
    if bool(command) == bool(args.upstream):
        parser().error("give either --upstream URL or the server's command after --")
    if args.upstream and not args.upstream.startswith(("http://", "https://")):
        parser().error("--upstream must be an http(s) URL")
    listen = None
    if args.listen:
        host, _, port = args.listen.rpartition(":")
        if not host or not port.isdigit():
            parser().error("--listen takes HOST:PORT")
        listen = (host.strip("[]"), int(port))
    listen_token = None
    if listen and listen[0] not in LOOPBACK and not args.listen_token_env:
        parser().error("a --listen address other than loopback needs --listen-token-env")
    if args.listen_token_env:
        listen_token = environ.get(args.listen_token_env, "")
        if not listen or not listen_token:
            parser().error("--listen-token-env needs --listen and a non-empty variable")
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
                      progress_interval=args.progress_interval, upstream=args.upstream,
                      listen=listen, listen_token=listen_token)


def server_environment(config: GateConfig, environ: dict[str, str]) -> dict[str, str]:
    """The server's environment: the gate's own, less the Cosigner key."""
    return {k: v for k, v in environ.items() if k != config.key_env}


@asynccontextmanager
async def open_server(config: GateConfig) -> AsyncIterator[Streams]:
    """Streams to the MCP server: Streamable HTTP (``--upstream``) or a child on stdio."""
    if config.upstream is not None:
        async with upstream_http(config.upstream) as streams:
            yield streams
        return
    params = StdioServerParameters(command=config.command[0], args=list(config.command[1:]),
                                   env=server_environment(config, dict(os.environ)))
    async with stdio_client(params) as streams:
        yield streams


async def relay_session(config: GateConfig, gate: AsyncGate, from_client: Any,
                        to_client: Any) -> None:
    """One client session: its own run, its own server connection, one relay."""
    run_id = f"mcp-{uuid.uuid4().hex}"
    log.info("gate session run %s → %s as %s/%s", run_id, config.url, config.principal,
             config.initiator)
    settings = CallSettings(run_id=run_id, approval_timeout=config.approval_timeout,
                            progress_interval=config.progress_interval)
    async with open_server(config) as (from_server, to_server):
        relay = Relay(gate=gate, settings=settings, hide_denied=config.hide_denied,
                      to_client=to_client, to_server=to_server,
                      server_name=config.server_name)
        await relay.run(from_client, from_server)


def _gate(config: GateConfig) -> AsyncGate:
    return AsyncGate(config.url, config.api_key, timeout=config.timeout,
                     principal={"id": config.principal, "type": "user"},
                     initiator={"id": config.initiator, "type": "agent"})


async def serve_http(config: GateConfig) -> int:
    """Serve Streamable HTTP at ``/mcp`` until interrupted; the exit status."""
    import uvicorn

    assert config.listen is not None
    host, port = config.listen
    async with _gate(config) as gate:
        front = HttpFront(lambda read, write: relay_session(config, gate, read, write),
                          token=config.listen_token, security=security_for(host, port))
        server = uvicorn.Server(uvicorn.Config(front, host=host, port=port, lifespan="off",
                                               log_level="warning"))
        async with front.running():
            log.info("serving MCP Streamable HTTP at http://%s:%d/mcp → %s", host, port,
                     config.upstream or config.command[0])
            await server.serve()
    return 0


async def serve(config: GateConfig) -> int:
    """Run one gate session until the client closes stdin (or, with ``--listen``, serve
    HTTP sessions until interrupted); the exit status."""
    if config.listen is not None:
        return await serve_http(config)
    async with _gate(config) as gate, stdio_server() as (from_client, to_client):
        try:
            await relay_session(config, gate, from_client, to_client)
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
