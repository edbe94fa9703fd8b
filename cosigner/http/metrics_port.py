"""``GET /metrics`` on a separate port (``COSIGNER_METRICS_PORT``), without a token.

A minimal HTTP/1.1 responder on the app's event loop: one request per connection, the
same exposition as the token-protected route (:func:`cosigner.http.routes.metrics.scrape`).
Bound with ``SO_REUSEPORT`` so every ``--workers`` process can listen on it; in
multiprocess mode whichever answers sums every worker's series. Anything but
``GET /metrics`` is 404.
"""

from __future__ import annotations

import asyncio
import logging

from cosigner.context import AppContext
from cosigner.http.routes.metrics import scrape

log = logging.getLogger("cosigner.metrics")
_MAX_HEAD_BYTES = 8192


async def serve_metrics(ctx: AppContext, host: str, port: int) -> asyncio.Server:
    """Start listening; the caller closes the returned server."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, path, _ = head[:_MAX_HEAD_BYTES].split(b"\r\n", 1)[0].split(b" ", 2)
            if method == b"GET" and path.split(b"?", 1)[0] == b"/metrics":
                from prometheus_client import CONTENT_TYPE_LATEST  # first scrape

                body, status = await scrape(ctx), b"200 OK"
                kind = CONTENT_TYPE_LATEST.encode()
            else:
                body, status, kind = b"not found\n", b"404 Not Found", b"text/plain"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind
                         + b"\r\nContent-Length: " + str(len(body)).encode()
                         + b"\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ValueError, ConnectionError):
            pass
        except Exception:  # noqa: BLE001 - a failed scrape must not take the loop down
            log.exception("metrics scrape failed")
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, reuse_port=True)
