"""One write per response (cosigner.http.coalesce): over real loopback sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from cosigner.cli.main import http_protocol, uvicorn_options
from cosigner.core.settings import Settings
from cosigner.http.coalesce import HOLD_MAX, PROTOCOL, CoalescingTransport
from tests.conftest import LiveServer


def _split(raw: bytes) -> tuple[bytes, bytes, int]:
    head, _, body = raw.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                  if line.lower().startswith(b"content-length:"))
    return head, body, length


def _read_response(sock: socket.socket, first: bytes = b"") -> tuple[bytes, bytes]:
    raw = first
    while b"\r\n\r\n" not in raw:
        raw += sock.recv(65536)
    head, body, length = _split(raw)
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


def test_serve_uses_the_coalescing_protocol() -> None:
    assert http_protocol() == PROTOCOL
    assert uvicorn_options("127.0.0.1", 0, Settings())["http"] == PROTOCOL


def test_a_response_leaves_in_one_segment(live_server_factory: Callable[..., LiveServer]
                                          ) -> None:
    # The client blocks in recv() before the server answers: it wakes on the first
    # segment. With the head and the body written separately that segment held the head
    # alone; written as one, the first recv() holds the whole response, every time.
    server = live_server_factory()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        for _ in range(20):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            first = sock.recv(65536)
            head, body, length = _split(first)
            assert head.startswith(b"HTTP/1.1 200")
            assert len(body) == length, first  # the body came with the head
            assert json.loads(body)["status"] == "ok"


def test_pipelined_and_large_responses_arrive_whole_and_in_order(
        live_server_factory: Callable[..., LiveServer]) -> None:
    # Two requests in one packet (keep-alive pipelining), then the OpenAPI document
    # (larger than HOLD_MAX: passed through, flow control as before).
    server = live_server_factory()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = _read_response(sock)
        assert head.startswith(b"HTTP/1.1 200") and json.loads(body)["status"] == "ok"
        rest = b""
        head, body = _read_response(sock, rest)
        assert head.startswith(b"HTTP/1.1 200")
        assert len(body) > HOLD_MAX
        assert "/v1/decisions" in json.loads(body)["paths"]


class _Collect(asyncio.Protocol):
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.closed = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()


@contextlib.asynccontextmanager
async def _pair() -> AsyncIterator[tuple[CoalescingTransport, asyncio.Transport, _Collect]]:
    """A real loopback connection: the server side's transport wrapped (and the raw one),
    and what the client side received. Everything is closed on exit."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[asyncio.Transport] = loop.create_future()

    class _Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.set_result(transport)  # type: ignore[arg-type]

    server = await loop.create_server(_Server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client, collect = await loop.create_connection(_Collect, "127.0.0.1", port)
    raw = await accepted
    try:
        yield CoalescingTransport(raw, loop), raw, collect
    finally:
        raw.close()
        client.close()
        server.close()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0.01)


async def test_writes_of_one_step_go_out_as_one_and_in_order() -> None:
    async with _pair() as (wrapped, _, collect):
        wrapped.write(b"head\r\n")
        wrapped.write(memoryview(b"body-1"))
        assert collect.chunks == [] and wrapped.get_write_buffer_size() == 12
        await _settle()
        assert collect.chunks == [b"head\r\nbody-1"]
        wrapped.write(b"a")
        wrapped.writelines([b"b", bytearray(b"c")])
        await _settle()
        assert collect.chunks[1:] == [b"abc"]


async def test_close_flushes_and_abort_drops() -> None:
    async with _pair() as (wrapped, _, collect):
        wrapped.write(b"last words")
        wrapped.close()  # flushed before the transport closes
        await asyncio.wait_for(collect.closed.wait(), 5)
        assert b"".join(collect.chunks) == b"last words"
    async with _pair() as (wrapped, _, collect):
        wrapped.write(b"never sent")
        wrapped.abort()
        await asyncio.wait_for(collect.closed.wait(), 5)
        assert collect.chunks == []


@pytest.mark.parametrize("sizes", [[HOLD_MAX + 1], [HOLD_MAX // 2, HOLD_MAX // 2 + 10]])
async def test_more_than_hold_max_passes_through_at_once(sizes: list[int]) -> None:
    async with _pair() as (wrapped, raw, collect):
        for i, size in enumerate(sizes):
            wrapped.write(bytes([65 + i]) * size)
        # Nothing is held back past HOLD_MAX: the real transport has it already.
        assert wrapped.get_write_buffer_size() == raw.get_write_buffer_size()
        await _settle()
        got = b"".join(collect.chunks)
        assert got == b"".join(bytes([65 + i]) * s for i, s in enumerate(sizes))


async def test_a_held_buffer_is_sent_as_it_was_written() -> None:
    # A bytearray changed after write() returned goes out as it was when written (the
    # transport's own write copies too).
    async with _pair() as (wrapped, _, collect):
        buffer = bytearray(b"first")
        wrapped.write(buffer)
        buffer[:] = b"XXXXX"
        await _settle()
        assert b"".join(collect.chunks) == b"first"
