"""Session 12 review probes of ``cosigner serve``'s coalescing protocol
(cosigner.http.coalesce), against a real server over loopback sockets.

A client that sends its request and then half-closes (``shutdown(SHUT_WR)``; e.g.
``printf 'GET ...' | nc -N``) is answered by uvicorn's own protocol: the response is on
the transport before the loop reads the end of file. The transport then closes itself
(``eof_received`` returns a false value) and sends what it buffered. Held writes reach it
only at the end of the loop step, after that read: without a flush at ``eof_received``
the response was dropped and the client read nothing.

``Expect: 100-continue``: the interim response, held like any write, still reaches a
client that waits for it before sending its body.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

from tests.cli.test_reads import add_keys
from tests.conftest import LiveServer, decision_request


def _request_then_half_close(port: int, request: bytes) -> bytes:
    """Send ``request``, shut the writing side, read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    return raw


#: Requests answered within the step that reads them (no database, no thread), so
#: uvicorn's own protocol answers them before it reads the end of file, every time.
HALF_CLOSED = [
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 200 "),
    (b"GET /no-such-route HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 404 "),
    (b"GET /v1/audit/export HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 401 "),
    (b"GET /healthz HTTP/1.0\r\n\r\n", b"HTTP/1.1 200 "),  # closed after it anyway
]


def test_a_half_closed_client_still_gets_its_answer(
        live_server_factory: Callable[..., LiveServer]) -> None:
    # Before the fix: b"" for each HTTP/1.1 request, 10 times out of 10 (the HTTP/1.0
    # one passed: its response is followed by close(), which flushes).
    server = live_server_factory()
    for request, status in HALF_CLOSED:
        for _ in range(10):
            raw = _request_then_half_close(server.port, request)
            assert raw.startswith(status), (request, raw)
            head, _, body = raw.partition(b"\r\n\r\n")
            length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                          if line.lower().startswith(b"content-length:"))
            assert len(body) == length


def _read_until_complete(sock: socket.socket) -> bytes:
    """One response with a ``content-length`` (the server keeps the connection)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        raw += sock.recv(65536)
    head, _, body = raw.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    return raw


def test_expect_100_continue_is_answered_before_the_body_is_sent(
        live_server_factory: Callable[..., LiveServer], database_url: str,
        tenant: str) -> None:
    # The interim response is written when the app first asks for the body, then held
    # to the end of that step: it must still leave while the client waits for it (the
    # client below sends no body until it has it), twice on one connection.
    server = live_server_factory()
    [key] = add_keys(database_url, (tenant, "runtime", "expect-100"))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        for _ in range(2):
            body = json.dumps(decision_request()).encode()
            sock.sendall(b"POST /v1/decisions HTTP/1.1\r\nHost: x\r\n"
                         b"Authorization: Bearer " + key.encode() + b"\r\n"
                         b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
            interim = b""
            while not interim.endswith(b"\r\n\r\n"):
                interim += sock.recv(1)  # times out (10 s) if it never comes
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(body)
            raw = _read_until_complete(sock)
            assert raw.startswith(b"HTTP/1.1 200 "), raw
            assert json.loads(raw.partition(b"\r\n\r\n")[2])["effect"] == "allow"
