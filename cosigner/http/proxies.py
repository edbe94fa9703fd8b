"""Trusted proxies: whose ``X-Forwarded-*`` headers decide the client address, scheme, host.

The one source of truth is ``settings.forwarded_allow_ips`` (``cosigner serve
--forwarded-allow-ips``); uvicorn's own proxy handling is switched off (it trusts
127.0.0.1 by default). Rules, applied to every HTTP request before any route sees it:

* peer not trusted (the default: no peer is) → ``X-Forwarded-*`` are ignored; the client
  is the TCP peer.
* peer trusted → the client is the right-most ``X-Forwarded-For`` entry that is not itself
  a trusted proxy (each proxy appends the address it saw, so entries left of that are
  whatever the client chose to send); when every entry is trusted, the left-most one.
  ``X-Forwarded-Proto`` (``http``/``https``) and ``X-Forwarded-Host`` become the request's
  scheme and ``Host``; with several values, the right-most (the nearest proxy's) counts.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_HOST_RE = re.compile(r"^[A-Za-z0-9.\-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$")
_MAX_ENTRY = 100


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP of an ``X-Forwarded-For`` entry (``1.2.3.4``, ``1.2.3.4:5``, ``[::1]:5``)."""
    text = text.strip()
    if text.startswith("[") and "]" in text:
        text = text[1:text.index("]")]
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class ProxyRules:
    """The rules above for the networks ``trusted`` (IP network texts)."""

    def __init__(self, *, trusted: Iterable[str]) -> None:
        self.networks: tuple[Network, ...] = tuple(ipaddress.ip_network(n) for n in trusted)

    def is_trusted(self, host: str | None) -> bool:
        """True when ``host`` (an IP address text) lies in a trusted network."""
        address = _address(host) if host else None
        return address is not None and any(address in net for net in self.networks)

    def client_of(self, forwarded_for: list[str]) -> str | None:
        """The client address named by the ``X-Forwarded-For`` entries (see module doc)."""
        entries = [e.strip() for value in forwarded_for for e in value.split(",") if e.strip()]
        for entry in reversed(entries):
            if not self.is_trusted(entry):
                address = _address(entry)
                return str(address) if address is not None else entry[:_MAX_ENTRY]
        return str(_address(entries[0]) or entries[0][:_MAX_ENTRY]) if entries else None

    def apply(self, scope: Scope) -> Scope:
        """``scope`` as the rules make it: a rewritten copy when an HTTP or WebSocket
        request comes from a trusted peer, else ``scope`` itself."""
        if self.networks and scope["type"] in ("http", "websocket"):
            peer = scope.get("client")
            if peer and self.is_trusted(peer[0]):
                return self._forwarded(scope)
        return scope

    def _forwarded(self, scope: Scope) -> Scope:
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers", []))
        values: dict[bytes, list[str]] = {}
        for name, value in headers:
            if name in (b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host"):
                values.setdefault(name, []).append(value.decode("latin-1"))
        scope = dict(scope)
        client = self.client_of(values.get(b"x-forwarded-for", []))
        if client:
            scope["client"] = (client, 0)
        proto = _last(values.get(b"x-forwarded-proto", [])).lower()
        if proto in ("http", "https"):
            scope["scheme"] = proto if scope["type"] == "http" else proto.replace("http", "ws")
        host = _last(values.get(b"x-forwarded-host", []))
        if host and _HOST_RE.match(host):
            scope["headers"] = [(n, v) for n, v in headers if n != b"host"] + [
                (b"host", host.encode("latin-1"))]
        return scope


class TrustedProxies(ProxyRules):
    """Pure ASGI middleware rewriting ``client``, ``scheme`` and ``Host`` per the rules above."""

    def __init__(self, app: ASGIApp, *, trusted: Iterable[str]) -> None:
        super().__init__(trusted=trusted)
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(self.apply(scope), receive, send)


def _last(values: list[str]) -> str:
    """The right-most entry of a comma-separated, possibly repeated header."""
    entries = [e.strip() for value in values for e in value.split(",") if e.strip()]
    return entries[-1] if entries else ""
