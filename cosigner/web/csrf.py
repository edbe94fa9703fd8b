"""CSRF tokens for the approver forms (synchronizer token derived from the session).

The token is ``HMAC-SHA256(key=cookie value, "cosigner-csrf-v1")``: it needs no storage,
works on every replica, differs for every session (another session's token is refused),
and does not reveal the cookie it is derived from. Before sign-in the login form is bound
to a random pre-session cookie the same way. Compared with :func:`hmac.compare_digest`.
"""

from __future__ import annotations

import hashlib
import hmac

FIELD = "csrf_token"
_LABEL = b"cosigner-csrf-v1"


def token_for(cookie_value: str) -> str:
    """The form token of the session (or pre-session) whose cookie is ``cookie_value``."""
    return hmac.new(cookie_value.encode(), _LABEL, hashlib.sha256).hexdigest()


def is_valid(cookie_value: str | None, submitted: str | None) -> bool:
    """True when ``submitted`` is the token of ``cookie_value`` (both present)."""
    if not cookie_value or not submitted:
        return False
    return hmac.compare_digest(token_for(cookie_value).encode(), submitted.encode())
