"""The gate's message relay between an MCP client (our stdio) and the real server (a
child process on stdio), at the JSON-RPC envelope level.

Everything passes through unchanged — requests, responses, notifications, and the
server's own requests to the client (sampling, roots, elicitation) — with three
exceptions:

* ``tools/call`` from the client is held and run through :func:`calls.gate_call`; the
  server sees it only after a successful redeem, and its reply is relayed unchanged;
* ``notifications/cancelled`` for a held call stops it (and is forwarded when the call
  already reached the server);
* with ``hide_denied``, the server's ``tools/list`` result loses the tools the
  tenant's catalogue denies outright (``GET /v1/tools``; unreadable → listed unfiltered,
  since every call is still gated).

Relaying envelopes rather than re-serving the protocol through the SDK's ``Server`` and
``ClientSession`` keeps the gate transparent: capabilities, protocol version and every
method the two ends agree on work without the gate knowing them.

When the server's output ends (it exited or crashed) the gate stays up: held calls
report ``error``/``unknown`` and answer a tool error, forwarded requests get a JSON-RPC
error, and later tool calls are refused before Cosigner is asked.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.message import SessionMessage
from mcp_types import (
    INTERNAL_ERROR,
    PARSE_ERROR,
    ErrorData,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    RequestId,
)

from cosigner_client.errors import GateError
from cosigner_client.gate import AsyncGate
from cosigner_client.mcp_gate import results
from cosigner_client.mcp_gate.calls import CallSettings, Reply, ServerGone, gate_call

log = logging.getLogger("cosigner_client.mcp_gate")
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/-]+")


@dataclass
class _Held:
    """A gated tools/call: its cancel scope and, once forwarded, the server's reply."""

    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    forwarded: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)
    reply: Reply | None = None


class Relay:
    """One gate session. ``run`` returns when the client closes its side."""

    def __init__(self, *, gate: AsyncGate, settings: CallSettings, hide_denied: bool,
                 to_client: WriteStream[SessionMessage],
                 to_server: WriteStream[SessionMessage],
                 server_name: str | None = None) -> None:
        self._gate = gate
        self._settings = settings
        self._hide_denied = hide_denied
        self._to_client = to_client
        self._to_server = to_server
        self._server_name = server_name
        self._down: str | None = None
        self._closing = False
        self._held: dict[RequestId, _Held] = {}
        self._forwarded: dict[RequestId, str] = {}  # other client requests: id → method

    async def run(self, from_client: ReadStream[SessionMessage | Exception],
                  from_server: ReadStream[SessionMessage | Exception]) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._pump_server, from_server)
            async for item in from_client:
                await self._from_client(tg, item)
            self._closing = True
            tg.cancel_scope.cancel()  # the client is gone: nobody to answer

    # ------------------------------------------------------------------ client → server

    async def _from_client(self, tg: TaskGroup, item: SessionMessage | Exception) -> None:
        if isinstance(item, Exception):
            await self._send_client(JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(
                code=PARSE_ERROR, message="invalid JSON-RPC message")))
            return
        msg = item.message
        if isinstance(msg, JSONRPCRequest) and msg.method == "tools/call":
            held = self._held[msg.id] = _Held()
            tg.start_soon(self._run_call, msg, held)
            return
        if isinstance(msg, JSONRPCNotification) and msg.method == "notifications/cancelled":
            target = (msg.params or {}).get("requestId")
            held_call = self._held.get(target) if target is not None else None
            if held_call is not None:
                if held_call.forwarded:
                    await self._send_server(msg)
                held_call.scope.cancel()
                return
        if isinstance(msg, JSONRPCRequest):
            if self._down is not None:
                await self._send_client(self._error(msg.id, f"MCP server not running "
                                                            f"({self._down})"))
                return
            self._forwarded[msg.id] = msg.method
        try:
            await self._send_server(msg)
        except ServerGone:
            pass  # requests among these are answered by _server_gone

    async def _run_call(self, request: JSONRPCRequest, held: _Held) -> None:
        token = ((request.params or {}).get("_meta") or {}).get("progressToken")
        progress = None if token is None else self._progress_sender(token)
        try:
            with held.scope:
                if self._down is not None:
                    name = (request.params or {}).get("name")
                    reply: Reply = results.server_down(request.id, str(name), self._down)
                else:
                    try:
                        reply = await gate_call(
                            self._gate, self._settings, request, server=self._server_name,
                            forward=lambda r: self._forward(r, held), progress=progress)
                    except Exception as exc:  # noqa: BLE001 - any gate fault: fail closed
                        log.exception("gate error on tools/call")
                        name = (request.params or {}).get("name")
                        reply = results.gate_failed(request.id, str(name), "gate_error",
                                                    type(exc).__name__)
                await self._send_client(reply)
        finally:
            self._held.pop(request.id, None)

    async def _forward(self, request: JSONRPCRequest, held: _Held) -> Reply:
        if self._down is not None:
            raise ServerGone(self._down)
        held.forwarded = True
        await self._send_server(request)
        await held.done.wait()
        if held.reply is None:
            raise ServerGone(self._down or "no reply", sent=True)
        return held.reply

    def _progress_sender(self, token: Any) -> Callable[[float, float | None, str],
                                                        Awaitable[None]]:
        last = [-1.0]

        async def send(progress: float, total: float | None, message: str) -> None:
            value = max(progress, last[0] + 0.001)  # MCP: progress increases every time
            last[0] = value
            params: dict[str, Any] = {"progressToken": token, "progress": value,
                                      "message": message}
            if total is not None:
                params["total"] = total
            await self._send_client(JSONRPCNotification(
                jsonrpc="2.0", method="notifications/progress", params=params))
        return send

    # ------------------------------------------------------------------ server → client

    async def _pump_server(self, from_server: ReadStream[SessionMessage | Exception]) -> None:
        try:
            async for item in from_server:
                if isinstance(item, Exception):
                    log.warning("unparseable message from the MCP server dropped: %s", item)
                    continue
                await self._from_server(item.message)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await self._server_gone("its output ended: exited or crashed")

    async def _from_server(self, msg: JSONRPCMessage) -> None:
        if isinstance(msg, JSONRPCResponse | JSONRPCError) and msg.id is not None:
            held = self._held.get(msg.id)
            if held is not None and held.forwarded:
                held.reply = msg
                held.done.set()
                return
            method = self._forwarded.pop(msg.id, None)
            if isinstance(msg, JSONRPCResponse):
                if method == "initialize":
                    self._learn_name(msg.result)
                elif method == "tools/list" and self._hide_denied:
                    msg = await self._filter_tools(msg)
        await self._send_client(msg)

    def _learn_name(self, result: dict[str, Any]) -> None:
        info = result.get("serverInfo")
        if self._server_name is None and isinstance(info, dict) and info.get("name"):
            self._server_name = _NAME_UNSAFE.sub("-", str(info["name"])).strip("-") or None
            log.info("server name %r (from initialize; --server-name sets it)",
                     self._server_name)

    async def _filter_tools(self, msg: JSONRPCResponse) -> JSONRPCResponse:
        tools = msg.result.get("tools")
        if self._server_name is None or not isinstance(tools, list):
            return msg
        try:
            catalogue = await self._gate.tools()
        except GateError as exc:
            log.warning("tools/list unfiltered: catalogue unreadable (%s)", exc.code)
            return msg
        kept = [t for t in tools if not (isinstance(t, dict) and catalogue.denies_outright(
            f"{self._server_name}.{t.get('name')}"))]
        if len(kept) != len(tools):
            log.info("tools/list: %d of %d tools hidden (denied outright)",
                     len(tools) - len(kept), len(tools))
        return msg.model_copy(update={"result": {**msg.result, "tools": kept}})

    async def _server_gone(self, why: str) -> None:
        if self._down is not None or self._closing:
            return
        self._down = why
        log.error("MCP server stopped (%s); tool calls are refused from now on", why)
        for held in list(self._held.values()):
            held.done.set()  # reply None → ServerGone in _forward
        for request_id in list(self._forwarded):
            del self._forwarded[request_id]
            await self._send_client(self._error(request_id, f"MCP server stopped ({why})"))

    # ------------------------------------------------------------------ sending

    @staticmethod
    def _error(request_id: RequestId, message: str) -> JSONRPCError:
        return JSONRPCError(jsonrpc="2.0", id=request_id,
                            error=ErrorData(code=INTERNAL_ERROR, message=message))

    async def _send_client(self, msg: JSONRPCMessage) -> None:
        try:
            await self._to_client.send(SessionMessage(msg))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            log.info("client gone; message dropped")

    async def _send_server(self, msg: JSONRPCMessage) -> None:
        if self._down is not None:
            raise ServerGone(self._down)
        try:
            await self._to_server.send(SessionMessage(msg))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            await self._server_gone("its input is closed")
            raise ServerGone(self._down or "stopped") from exc
