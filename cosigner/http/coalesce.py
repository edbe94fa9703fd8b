"""uvicorn's httptools protocol with a response's writes sent as one.

uvicorn writes a response in two ``transport.write`` calls: the status line and headers
at ``http.response.start``, the body at ``http.response.body``. On an idle socket each
write is a ``send()`` system call and a TCP segment of its own, and the loopback
delivery of each segment is done by the sender's CPU: under load the two writes were
~15 % of the serving process's samples (py-spy, ``bench/profile.py --system allow-py``;
bench/README.md, "Session 12: one write per response").

:class:`CoalescingHttpToolsProtocol` gives uvicorn's request cycles a transport that
holds what is written during one step of the event loop and sends it as one write at the
end of that step (``loop.call_soon``: the callback runs in the loop's next round of
ready callbacks, after one poll for I/O that does not wait, uvloop and asyncio alike). So
a response's head and body, sent by the app back to back, leave in one ``send()``. What
changes nothing else:

* bytes leave in the order written, on the same transport, before any ``close`` (which
  flushes first) and before the loop waits for I/O; ``abort`` drops what is held as it
  drops the transport's own buffer;
* the I/O read in between can be the client's end of file (a half-close after its
  request), on which the transport closes itself: ``eof_received`` flushes first, so a
  response held then is sent, as uvicorn's own protocol sends it;
* a stream that writes more than :data:`HOLD_MAX` bytes in one step is passed through
  at once, so the transport's flow control (``pause_writing``) sees the bytes as before;
* every other transport method is the real transport's.

Selected by ``cosigner serve`` with ``uvicorn.Config(http=PROTOCOL)``; where httptools
is not installed uvicorn's ``auto`` choice is kept (:func:`cosigner.cli.main.http_protocol`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: The import path ``uvicorn.Config(http=...)`` takes.
PROTOCOL = "cosigner.http.coalesce:CoalescingHttpToolsProtocol"
#: Bytes held in one loop step before writes pass straight through (a response head and
#: a JSON body are far below it; a streamed export is not held back).
HOLD_MAX = 64 * 1024


class CoalescingTransport:
    """A ``asyncio.Transport`` stand-in that sends the writes of one loop step as one
    write of the wrapped ``transport`` (module doc). Not thread-safe (nor is the
    transport)."""

    __slots__ = ("_transport", "_loop", "_held", "_size")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop
                 ) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Hold ``data`` until the end of this loop step (or pass it and everything held
        through at once past :data:`HOLD_MAX` bytes)."""
        held = self._held
        if not held:
            if len(data) > HOLD_MAX:
                self._transport.write(data)
                return
            self._loop.call_soon(self.flush)
        if type(data) is not bytes:
            data = bytes(data)  # a caller's buffer may change after write() returns
        held.append(data)
        self._size += len(data)
        if self._size > HOLD_MAX:
            self.flush()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Send what is held, as one write. A transport closing but not closed yet takes
        it as it would have taken the writes themselves (it still sends its buffer); one
        already closed refuses it (uvloop: ``RuntimeError``) and the bytes are dropped,
        as they could not leave."""
        held = self._held
        if not held:
            return
        self._held = []
        self._size = 0
        try:
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))
        except RuntimeError:
            if not self._transport.is_closing():
                raise

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = []
        self._size = 0
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._size + self._transport.get_write_buffer_size()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:
        # pause_reading, resume_reading, set_protocol, ...: the real transport's.
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol whose request cycles write through a
    :class:`CoalescingTransport` (module doc); parsing, flow control and connection
    handling are uvicorn's own."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Set after uvicorn read the transport's addresses and built its flow control
        # on the real transport (pause/resume reading act on the socket itself).
        self.transport = CoalescingTransport(transport, self.loop)  # type: ignore[assignment]

    def eof_received(self) -> None:
        """The client half-closed: send what is held first. uvicorn answers ``None`` (the
        transport then closes itself, after sending what it buffered), and a response
        held from the step before that read must be in that buffer, as uvicorn's own
        writes are; flushed later it was dropped (the transport is closing)."""
        self.transport.flush()  # type: ignore[attr-defined]
        super().eof_received()
