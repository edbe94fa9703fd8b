"""Session 12 review probes of ``cosigner serve``'s coalescing protocol
(cosigner.http.coalesce), against a real server over loopback sockets.

A client that sends its request and then half-closes (``shutdown(SHUT_WR)``; e.g.
``printf 'GET ...' | nc -N``) is answered by uvicorn's own protocol: the response is on
the transport before the loop reads the end of file. The transport then closes itself
(``eof_received`` returns a false value) and sends what it buffered. Held writes reach it
only at the end of the loop step, after that read: without a flush at ``eof_received``
the response was dropped and the client read nothing.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from tests.conftest import LiveServer


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
