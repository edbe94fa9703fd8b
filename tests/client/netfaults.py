"""Real network faults on loopback for client tests: a forwarding proxy that can stall,
lose responses or answer 503, and a socket that accepts and never answers."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


class FaultProxy:
    """HTTP proxy to ``upstream``. ``plan["POST /v1/decisions"] = ["lose", "pass"]`` sets
    what happens to the next requests matching that method and path prefix:

    ``pass`` forward; ``lose`` forward, then close without answering (the server acted,
    the client never hears); ``stall:S`` wait S seconds, then forward; ``hold:S`` forward,
    then wait S seconds before answering; ``503`` answer 503 without forwarding;
    ``garbage`` forward, then answer 200 with a body that is not JSON; ``reshape`` forward,
    then answer 200 with JSON of the wrong shape. ``Retry-After`` is passed through.
    Requests seen are counted in ``seen``; ``forwarded`` counts those that reached upstream.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.plan: dict[str, list[str]] = defaultdict(list)
        self.seen: Counter[str] = Counter()
        self.forwarded: Counter[str] = Counter()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                return

            def _handle(self) -> None:
                proxy.handle(self)

            do_GET = do_POST = _handle  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _action(self, method: str, path: str) -> str:
        with self._lock:
            for key, actions in self.plan.items():
                want_method, _, prefix = key.partition(" ")
                if method == want_method and path.startswith(prefix) and actions:
                    return actions.pop(0)
        return "pass"

    def handle(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path
        key = f"{req.command} {path.split('?')[0]}"
        self.seen[key] += 1
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else b""
        action = self._action(req.command, path)
        if action == "503":
            self._answer(req, 503, b'{"code":"storage_unavailable","detail":"injected"}')
            return
        if action.startswith("stall:"):
            time.sleep(float(action.split(":")[1]))
        headers = {k: v for k, v in req.headers.items()
                   if k.lower() in ("authorization", "content-type")}
        try:
            resp = httpx.request(req.command, self.upstream + path, content=body,
                                 headers=headers, timeout=60)
        except httpx.HTTPError:
            self._answer(req, 502, b'{"code":"bad_gateway","detail":"upstream"}')
            return
        self.forwarded[key] += 1
        if action == "lose":
            req.close_connection = True
            req.connection.shutdown(socket.SHUT_RDWR)
            return
        if action.startswith("hold:"):
            time.sleep(float(action.split(":")[1]))
        if action == "garbage":
            self._answer(req, 200, b"<html>502 upstream hiccup</html>", "application/json")
            return
        if action == "reshape":
            self._answer(req, 200, b'{"effect": 7, "reasons": "none"}', "application/json")
            return
        self._answer(req, resp.status_code, resp.content,
                     resp.headers.get("content-type", "application/json"),
                     retry_after=resp.headers.get("retry-after"))

    @staticmethod
    def _answer(req: BaseHTTPRequestHandler, status: int, content: bytes,
                content_type: str = "application/problem+json",
                retry_after: str | None = None) -> None:
        try:
            req.send_response(status)
            req.send_header("Content-Type", content_type)
            if retry_after is not None:
                req.send_header("Retry-After", retry_after)
            req.send_header("Content-Length", str(len(content)))
            req.end_headers()
            req.wfile.write(content)
        except OSError:
            pass  # the client gave up; that is the point of some tests

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class StalledSocket:
    """Accepts connections on loopback and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._conns: list[socket.socket] = []
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
                self._conns.append(conn)
            except OSError:
                continue

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2)
        for conn in self._conns:
            conn.close()
        self.sock.close()
