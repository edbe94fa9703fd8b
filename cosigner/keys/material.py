"""What a signing key is: its metadata, its JWKS entry, and the rules of its life.

A key is generated as an Ed25519 JWK whose ``kid`` is its RFC 7638 thumbprint. It signs
from ``activates_at`` (or its creation) until it is retired; a retired key only verifies,
and stays published until ``not_after = retired_at + max token lifetime``, when no token it
signed can still be valid. Used by the keyring (:mod:`cosigner.keys.keyring`), the key
folder of earlier versions (:mod:`cosigner.keys.folder`) and the database store
(:mod:`cosigner.keys.store`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from cosigner.keys.ed25519 import Ed25519Key, ed25519_verifier

ALGORITHM = "Ed25519"
"""The default JWS ``alg`` of a key (RFC 9864's fully specified identifier)."""
ALGORITHMS = ("Ed25519", "EdDSA")
"""The ``alg`` a key may be created with: the same Ed25519 signature under RFC 9864's name or
under RFC 8037's ``EdDSA``, for executors whose JOSE library knows only that one (PyJWT).
Each key has exactly one, fixed at creation and published in the JWKS; a token is accepted
only under its key's own ``alg`` (case K17)."""


class KeyringError(RuntimeError):
    """The key folder cannot be used (corrupt or foreign file, wrong key type).

    A startup/operator failure, not a request error: it never reaches a client.
    """


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """Metadata of one key (all datetimes timezone-aware UTC)."""

    kid: str
    created_at: datetime
    retired_at: datetime | None = None
    not_after: datetime | None = None
    """After this instant the public key need not be published any more (retired keys only)."""
    activates_at: datetime | None = None
    """From this instant the key may sign (None: from ``created_at``). It is published
    before, so every verifier knows it before the first token it signs exists."""
    alg: str = ALGORITHM
    """The one JWS ``alg`` this key signs and verifies under (:data:`ALGORITHMS`)."""

    def __post_init__(self) -> None:
        if self.alg not in ALGORITHMS:
            raise KeyringError(f"key {self.kid}: alg must be one of {ALGORITHMS}")

    @property
    def signs_from(self) -> datetime:
        return self.activates_at or self.created_at

    def signs_at(self, now: datetime) -> bool:
        """True when the key is the signing key's candidate at ``now`` (activated, not
        retired)."""
        return self.signs_from <= now and (self.retired_at is None or now < self.retired_at)


@dataclass(frozen=True, slots=True)
class Entry:
    info: KeyInfo
    verify_key: Ed25519Key  # public part only
    public_jwk: dict[str, str]  # JWKS entry, built once
    #: ``check(signature, message)`` → valid (:func:`ed25519_verifier`), built once.
    check: Callable[[bytes, bytes], bool] | None = None


def check_lifetime(max_token_lifetime_s: int) -> None:
    if isinstance(max_token_lifetime_s, bool) or not isinstance(max_token_lifetime_s, int):
        raise TypeError("max_token_lifetime_s must be an int")
    if max_token_lifetime_s <= 0:
        raise ValueError("max_token_lifetime_s must be positive")


def utc(moment: datetime) -> datetime:
    if moment.tzinfo is UTC:  # already UTC (astimezone would copy it)
        return moment
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("datetime must be timezone-aware")
    return moment.astimezone(UTC)


def is_published(entry: Entry, now: datetime) -> bool:
    return entry.info.not_after is None or now < entry.info.not_after


def generate_key() -> Ed25519Key:
    return Ed25519Key.generate()


def make_entry(key: Ed25519Key, info: KeyInfo) -> Entry:
    verify_key = key.public()
    jwk = {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": str(verify_key.as_dict()["x"]),
        "kid": info.kid,
        "alg": info.alg,
        "use": "sig",
    }
    return Entry(info=info, verify_key=verify_key, public_jwk=jwk,
                 check=ed25519_verifier(key.x))


def retire(info: KeyInfo, *, at: datetime, lifetime: timedelta) -> KeyInfo:
    not_after = at + lifetime
    if info.not_after is not None and info.not_after > not_after:
        not_after = info.not_after
    return replace(info, retired_at=at, not_after=not_after)
