"""Streamable HTTP for ``cosigner-mcp-gate``: the remote-server side (``--upstream URL``:
the gate is an MCP client of a server speaking Streamable HTTP) and the client side
(``--listen HOST:PORT``: the gate serves Streamable HTTP at ``/mcp`` to its clients).

Both only change where the relay's streams come from: every session still runs through
:class:`~cosigner_client.mcp_gate.relay.Relay`, so the gates, refusal results and review
links are those of the stdio relay. Each client session served over HTTP gets its own
relay, its own connection to the server (or its own child process) and its own run.

Whoever reaches the listener calls tools under the gate's identity, so it checks
``Host``/``Origin`` against DNS rebinding (the SDK's transport security), with
``--listen-token-env VAR`` requires ``Authorization: Bearer <token>`` (mandatory for a
non-loopback address), and opens at most 100 sessions at once (503 beyond).
"""

from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from mcp.client.streamable_http import streamable_http_client
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.message import SessionMessage

log = logging.getLogger("cosigner_client.mcp_gate")

Streams = tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]
Session = Callable[[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]],
                   Awaitable[None]]
PATH = "/mcp"
SESSION_HEADER = "mcp-session-id"


@asynccontextmanager
async def upstream_http(url: str) -> AsyncIterator[Streams]:
    """Streams to a remote MCP server over Streamable HTTP (ended with a DELETE)."""
    async with streamable_http_client(url) as (read, write):
        yield read, write


def security_for(host: str, port: int) -> TransportSecuritySettings:
    """DNS-rebinding protection: only this listener's own host names are accepted."""
    names = {host, "127.0.0.1", "localhost", "[::1]"} if host in (
        "127.0.0.1", "localhost", "::1") else {host}
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{n}:{port}" for n in names] + sorted(names),
        allowed_origins=[f"http://{n}:{port}" for n in names])


async def _respond(send: Any, status: int, message: str, headers: list[tuple[bytes, bytes]]
                   | None = None) -> None:
    body = (b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"'
            + message.encode() + b'"}}')
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class HttpFront:
    """An ASGI app serving MCP Streamable HTTP at ``/mcp``; each new session (an
    ``initialize`` without ``Mcp-Session-Id``) runs ``session(read, write)`` in the
    front's task group until the client deletes it, it idles out, or the gate stops."""

    def __init__(self, session: Session, *, token: str | None = None,
                 security: TransportSecuritySettings | None = None,
                 idle_timeout: float = 1800.0, max_sessions: int = 100) -> None:
        self._session = session
        self._token = token
        self._security = security
        self._idle_timeout = idle_timeout
        self._max_sessions = max_sessions
        self._sessions: dict[str, StreamableHTTPServerTransport] = {}
        self._tg: TaskGroup | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[HttpFront]:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                yield self
            finally:
                for transport in list(self._sessions.values()):
                    with anyio.CancelScope(shield=True):
                        await transport.terminate()
                tg.cancel_scope.cancel()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].rstrip("/") != PATH:
            await _respond(send, 404, "not found: the MCP endpoint is /mcp")
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        if self._token is not None and not hmac.compare_digest(
                headers.get("authorization", "").encode(), f"Bearer {self._token}".encode()):
            await _respond(send, 401, "unauthorized",
                           [(b"www-authenticate", b'Bearer realm="cosigner-mcp-gate"')])
            return
        session_id = headers.get(SESSION_HEADER)
        if session_id is not None:
            transport = self._sessions.get(session_id)
            if transport is None:
                await _respond(send, 404, "Session not found")
                return
            await transport.handle_request(scope, receive, send)
            if transport.is_terminated:
                self._sessions.pop(session_id, None)
            return
        if len(self._sessions) >= self._max_sessions:
            await _respond(send, 503, "too many open sessions")
            return
        transport = StreamableHTTPServerTransport(
            mcp_session_id=uuid.uuid4().hex, security_settings=self._security,
            idle_timeout=self._idle_timeout)
        assert transport.mcp_session_id is not None and self._tg is not None
        self._sessions[transport.mcp_session_id] = transport
        await self._tg.start(self._run_session, transport)
        status: list[int] = []

        async def watch(message: Any) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        await transport.handle_request(scope, receive, watch)
        if not status or status[0] >= 400:  # no session was opened: do not keep one
            self._sessions.pop(transport.mcp_session_id, None)
            await transport.terminate()

    async def _run_session(self, transport: StreamableHTTPServerTransport, *,
                           task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        session_id = transport.mcp_session_id
        try:
            async with transport.connect() as (read, write):
                task_status.started()
                idle = transport.idle_scope or anyio.CancelScope()
                with idle:
                    await self._session(read, write)
                if idle.cancelled_caught:
                    log.info("session %s idle: closed", session_id)
        except Exception:  # noqa: BLE001 - one session's fault must not stop the others
            log.exception("session %s failed", session_id)
        finally:
            self._sessions.pop(str(session_id), None)
            if not transport.is_terminated:
                with anyio.CancelScope(shield=True):
                    await transport.terminate()
