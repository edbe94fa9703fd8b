"""Webhook signatures: ``Cosigner-Signature: t=<unix seconds>,v1=<hex>``.

``v1 = HMAC-SHA256(secret, "<t>." + body)`` over the exact body bytes. Receivers recompute
it with :func:`hmac.compare_digest` and refuse timestamps older than a few minutes
(replay). ``t`` is the time of the attempt, so every retry is signed afresh.
"""

from __future__ import annotations

import hashlib
import hmac

HEADER = "Cosigner-Signature"


def sign(secret: str, body: bytes, *, timestamp: int) -> str:
    """The header value for ``body`` sent at ``timestamp`` (UTC seconds)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, body: bytes, header: str, *, now: int, tolerance_s: int = 300) -> bool:
    """Receiver side: True when ``header`` signs ``body`` within ``tolerance_s`` of ``now``."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts.get("t", ""))
    except ValueError:
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = sign(secret, body, timestamp=timestamp).split(",v1=", 1)[1]
    return hmac.compare_digest(expected.encode(), parts.get("v1", "").encode())
