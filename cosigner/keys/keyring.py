"""Ed25519 signing keyring: compact JWS sign/verify, JWKS, rotation.

One key signs (the *current* key); retired keys only verify, and stay published in the JWKS
until every token they could have signed has expired (``not_after = retired_at + max token
lifetime``). After that they are dropped from memory and disk.

The JWS algorithm is pinned to ``"Ed25519"`` (RFC 9864, the fully-specified identifier that
deprecates ``EdDSA``). :meth:`Keyring.verify` reads the protected header itself before any
library call: the algorithm is compared exactly, ``kid`` is only a dictionary key (never a path,
never a URL), and nothing in a token chooses how it is verified (case K17).

On disk (``key_dir``, mode 0700) each key is ``<kid>.json`` (mode 0600, written atomically)::

    {"format": 1, "kid": ..., "created_at": ISO-8601 UTC, "retired_at": ... | null,
     "not_after": ... | null, "jwk": {...}}

The current key's ``jwk`` is private; a retired key's file keeps only the public JWK, since a
retired key never signs again. ``kid`` is the RFC 7638 thumbprint of the public key and is
checked against the key on load.

The serving processes keep their keys in the database instead (:mod:`cosigner.keys.store`),
and build the keyring with :meth:`Keyring.from_keys`: every key there carries an
``activates_at``, so a new key is published at once but signs only from that instant, and
:meth:`Keyring.advance` / :meth:`Keyring.install` move the keyring along that plan. The
folder format stays the upgrade path: :func:`read_key_folder` reads it for the import.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import OKPKey

from cosigner.core.errors import PermitRefused

__all__ = ["ALGORITHM", "KeyInfo", "Keyring", "KeyringError", "MAX_TOKEN_CHARS",
           "read_key_folder"]

logger = logging.getLogger(__name__)

ALGORITHM = "Ed25519"
"""The only JWS ``alg`` this keyring signs or accepts (RFC 9864)."""

MAX_TOKEN_CHARS = 16_384
"""Longer tokens are refused before any decoding (permits are a few hundred bytes)."""

_FILE_FORMAT = 1
_HEADER_MEMBERS = frozenset({"alg", "kid", "typ"})
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_KID = re.compile(r"[A-Za-z0-9_-]{43}")  # base64url SHA-256 thumbprint, as we generate them


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

    @property
    def signs_from(self) -> datetime:
        return self.activates_at or self.created_at

    def signs_at(self, now: datetime) -> bool:
        """True when the key is the signing key's candidate at ``now`` (activated, not
        retired)."""
        return self.signs_from <= now and (self.retired_at is None or now < self.retired_at)


@dataclass(frozen=True, slots=True)
class _Entry:
    info: KeyInfo
    verify_key: OKPKey  # public part only
    public_jwk: dict[str, str]  # JWKS entry, built once


class Keyring:
    """Current Ed25519 signing key plus the retired keys still published.

    Build with :meth:`load_or_create` (persistent) or :meth:`ephemeral` (tests). Keys are parsed
    once; :meth:`sign` and :meth:`verify` do no I/O.
    """

    def __init__(
        self,
        *,
        signing_key: OKPKey,
        entries: dict[str, _Entry],
        current_kid: str,
        max_token_lifetime_s: int,
        key_dir: Path | None,
    ) -> None:
        self._signing_key = signing_key
        self._headers: dict[tuple[str, str], bytes] = {}  # (kid, typ) → encoded header
        self._entries = entries
        self._current_kid = current_kid
        self._max_lifetime = timedelta(seconds=max_token_lifetime_s)
        self._key_dir = key_dir
        # Keys held by a keyring built with from_keys(): re-planned by advance()/install().
        self._material: tuple[tuple[OKPKey, KeyInfo], ...] = ()
        self._next_change: datetime | None = None
        self._refresh: Callable[[], Awaitable[bool]] | None = None

    # --- construction -------------------------------------------------------------------

    @classmethod
    def ephemeral(cls, *, now: datetime, max_token_lifetime_s: int = 3600) -> Keyring:
        """An in-memory keyring with one fresh key; nothing touches the disk."""
        _check_lifetime(max_token_lifetime_s)
        key = _generate_key()
        entry = _make_entry(key, KeyInfo(kid=key.thumbprint(), created_at=_utc(now)))
        return cls(
            signing_key=key,
            entries={entry.info.kid: entry},
            current_kid=entry.info.kid,
            max_token_lifetime_s=max_token_lifetime_s,
            key_dir=None,
        )

    @classmethod
    def load_or_create(cls, key_dir: Path, *, now: datetime, max_token_lifetime_s: int) -> Keyring:
        """Load the keyring from ``key_dir``, creating the folder (0700) and a first key if empty.

        Keys whose ``not_after`` has passed are deleted. If a crash left several unretired keys,
        the newest becomes current and the others are retired at its creation time.

        Raises:
            KeyringError: a key file is unreadable, foreign, or does not match its kid.
        """
        _check_lifetime(max_token_lifetime_s)
        now = _utc(now)
        lifetime = timedelta(seconds=max_token_lifetime_s)
        key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        _tighten(key_dir, 0o700)
        with _locked(key_dir):
            loaded = [_read_key_file(path) for path in sorted(key_dir.glob("*.json"))]
            for path in key_dir.glob(".*.tmp"):  # leftovers of an interrupted write
                path.unlink(missing_ok=True)

            unretired = [(k, i) for k, i in loaded if i.retired_at is None]
            unretired.sort(key=lambda pair: pair[1].created_at)
            if unretired:
                signing_key, current = unretired[-1]
            else:
                signing_key = _generate_key()
                current = KeyInfo(kid=signing_key.thumbprint(), created_at=now)
                _write_key_file(key_dir, signing_key, current)
            if not signing_key.is_private:
                raise KeyringError(f"current key {current.kid} has no private part")

            entries: dict[str, _Entry] = {current.kid: _make_entry(signing_key, current)}
            for key, info in loaded:
                if info.kid == current.kid:
                    continue
                if info.retired_at is None:  # older unretired key: finish its retirement
                    info = _retire(info, at=current.created_at, lifetime=lifetime)
                    _write_key_file(key_dir, key, info)
                else:  # honour a longer lifetime configured since the key was retired
                    info = _retire(info, at=info.retired_at, lifetime=lifetime)
                assert info.not_after is not None
                if info.not_after <= now:
                    (key_dir / f"{info.kid}.json").unlink(missing_ok=True)
                    continue
                entries[info.kid] = _make_entry(key, info)
        return cls(
            signing_key=signing_key,
            entries=entries,
            current_kid=current.kid,
            max_token_lifetime_s=max_token_lifetime_s,
            key_dir=key_dir,
        )

    @classmethod
    def from_keys(cls, keys: Sequence[tuple[OKPKey, KeyInfo]], *, now: datetime,
                  max_token_lifetime_s: int) -> Keyring:
        """A keyring over ``keys`` (private or public-only OKP keys with their metadata).

        At ``now`` it publishes every key whose ``not_after`` has not passed (keys not yet
        active included) and signs with the private key that :meth:`KeyInfo.signs_at`
        ``now`` and activated last (ties: greatest kid).

        Raises:
            KeyringError: no key with a private part signs at ``now``.
        """
        _check_lifetime(max_token_lifetime_s)
        signing_key, current_kid, entries, next_change = _plan(keys, _utc(now))
        keyring = cls(signing_key=signing_key, entries=entries, current_kid=current_kid,
                      max_token_lifetime_s=max_token_lifetime_s, key_dir=None)
        keyring._material, keyring._next_change = tuple(keys), next_change
        return keyring

    def install(self, keys: Sequence[tuple[OKPKey, KeyInfo]], *, now: datetime) -> None:
        """Replace the keys held by ``keys`` (a reload from storage), planned at ``now``
        as in :meth:`from_keys`. Raises :class:`KeyringError` like it, changing nothing."""
        signing_key, current_kid, entries, next_change = _plan(keys, _utc(now))
        self._swap(signing_key, current_kid, entries)
        self._material, self._next_change = tuple(keys), next_change

    def advance(self, *, now: datetime) -> bool:
        """Re-plan the keys held at ``now`` when an activation, retirement or expiry has
        come due since the last plan; True when the plan changed."""
        now = _utc(now)
        if self._next_change is None or now < self._next_change:
            return False
        self.install(self._material, now=now)
        return True

    def on_unknown_kid(self, refresh: Callable[[], Awaitable[bool]]) -> None:
        """Set how :meth:`refresh_for_unknown_kid` reloads the keys (storage's job)."""
        self._refresh = refresh

    async def refresh_for_unknown_kid(self) -> bool:
        """Reload the keys from storage once (the hook rate-limits); True when it did and
        a retried verification may now find a key another replica just published."""
        return self._refresh is not None and await self._refresh()

    def _swap(self, signing_key: OKPKey, current_kid: str, entries: dict[str, _Entry]) -> None:
        # Whole objects, each assigned once, with no await in between: a verify or sign on
        # the event loop sees the old plan or the new one, never a mix.
        self._entries = entries
        self._signing_key = signing_key
        self._current_kid = current_kid

    # --- rotation -----------------------------------------------------------------------

    def rotate(self, *, now: datetime) -> str:
        """Make a new signing key current and retire the old one; return the new kid.

        The old key keeps verifying and stays in the JWKS until ``now + max token lifetime``.
        Persisted when the keyring has a folder: the new key is written before the old one is
        marked retired, so a crash in between leaves two unretired keys that the next
        :meth:`load_or_create` resolves.
        """
        now = _utc(now)
        new_key = _generate_key()
        new_info = KeyInfo(kid=new_key.thumbprint(), created_at=now)
        old_entry = self._entries[self._current_kid]
        old_info = _retire(old_entry.info, at=now, lifetime=self._max_lifetime)
        if self._key_dir is not None:
            with _locked(self._key_dir):
                _write_key_file(self._key_dir, new_key, new_info)
                _write_key_file(self._key_dir, old_entry.verify_key, old_info)
        entries = {kid: e for kid, e in self._entries.items() if _is_published(e, now)}
        entries[old_info.kid] = replace(old_entry, info=old_info)
        entries[new_info.kid] = _make_entry(new_key, new_info)
        # Swap whole objects (no in-place mutation) so a concurrent verify sees a consistent map.
        self._swap(new_key, new_info.kid, entries)
        return new_info.kid

    # --- introspection ------------------------------------------------------------------

    @property
    def current_kid(self) -> str:
        return self._current_kid

    @property
    def max_token_lifetime_s(self) -> int:
        return int(self._max_lifetime.total_seconds())

    def keys(self) -> list[KeyInfo]:
        """Metadata of every key held (current first, then unretired, then retired)."""
        infos = [entry.info for entry in self._entries.values()]
        return sorted(infos, key=lambda info: (info.kid != self._current_kid,
                                               info.retired_at is not None))

    def jwks(self, *, now: datetime) -> dict[str, list[dict[str, str]]]:
        """The JWK Set to publish: ``{"keys": [{kty, crv, x, kid, alg, use}, ...]}``.

        Holds the current key and every retired key with ``not_after > now``.
        """
        return {"keys": [dict(entry.public_jwk) for entry in self._published(_utc(now))]}

    def _published(self, now: datetime) -> Iterator[_Entry]:
        return (entry for entry in self._entries.values() if _is_published(entry, now))

    # --- sign / verify ------------------------------------------------------------------

    def sign(self, claims: dict[str, Any], *, typ: str) -> str:
        """Compact JWS of ``claims`` (compact JSON) with the current key.

        Protected header: exactly ``{"alg": "Ed25519", "kid": <current kid>, "typ": typ}``.
        """
        # RFC 7515 §7.1 composed here (the signature is cryptography's Ed25519, which is
        # deterministic): joserfc's serialize_compact gives the same bytes, at several
        # times the cost on the decision path (tests/test_keys.py compares the two).
        key, kid = self._signing_key, self._current_kid
        header = self._headers.get((kid, typ))
        if header is None:
            header = self._headers[(kid, typ)] = _b64url(orjson.dumps(
                {"alg": ALGORITHM, "kid": kid, "typ": typ}))
        signing_input = header + b"." + _b64url(orjson.dumps(claims))
        private = key.private_key
        if not isinstance(private, Ed25519PrivateKey):
            raise KeyringError("the current signing key is not an Ed25519 private key")
        signature = private.sign(signing_input)
        return (signing_input + b"." + _b64url(signature)).decode("ascii")

    def verify(self, token: str, *, typ: str, now: datetime | None = None) -> dict[str, Any]:
        """Verify a compact JWS made by this keyring and return its claims.

        The header is parsed here, before the JOSE library sees the token: it must hold exactly
        ``alg``, ``kid`` and ``typ``; ``alg`` must equal ``"Ed25519"``; ``kid`` must name a key
        held in memory (with ``now``, one still published at ``now``); ``typ`` must equal
        ``typ``. Only then is the signature checked with that key and that algorithm.

        Raises:
            PermitRefused: ``malformed_permit`` (not a compact JWS, bad base64url/JSON, duplicate
                or unexpected header members, payload not a JSON object), ``bad_signature``
                (any other ``alg``, signature invalid), ``unknown_kid``,
                ``wrong_token_type``.
        """
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            raise PermitRefused("token is not a compact JWS", code="malformed_permit")
        segments = token.split(".")
        if len(segments) != 3:
            raise PermitRefused("token is not a compact JWS", code="malformed_permit")
        header = _decode_json_segment(segments[0], what="header")

        alg = header.get("alg")
        if not isinstance(alg, str) or alg != ALGORITHM:
            raise PermitRefused("algorithm not accepted", code="bad_signature")
        if header.keys() != _HEADER_MEMBERS:
            raise PermitRefused("unexpected JWS header members", code="malformed_permit")
        kid = header["kid"]
        if not isinstance(kid, str):
            raise PermitRefused("kid is not a string", code="malformed_permit")
        entry = self._entries.get(kid)
        if entry is None or (now is not None and not _is_published(entry, _utc(now))):
            raise PermitRefused("signing key is not known", code="unknown_kid")
        if header["typ"] != typ:
            raise PermitRefused("token type not accepted here", code="wrong_token_type")

        try:
            jws.deserialize_compact(token, entry.verify_key, algorithms=[ALGORITHM])
        except JoseError as exc:
            raise PermitRefused("signature verification failed", code="bad_signature") from exc
        # Parse the payload segment ourselves, with the same strict JSON rules as the header.
        return _decode_json_segment(segments[1], what="payload")


# --- helpers ----------------------------------------------------------------------------


def _plan(keys: Sequence[tuple[OKPKey, KeyInfo]], now: datetime
          ) -> tuple[OKPKey, str, dict[str, _Entry], datetime | None]:
    """(signing key, its kid, published entries, next instant the plan changes) at ``now``."""
    entries: dict[str, _Entry] = {}
    signer: tuple[OKPKey, KeyInfo] | None = None
    changes: list[datetime] = []
    for key, info in keys:
        if info.not_after is not None and info.not_after <= now:
            continue
        entries[info.kid] = _make_entry(key, info)
        changes += [t for t in (info.activates_at, info.retired_at, info.not_after)
                    if t is not None and t > now]
        if key.is_private and info.signs_at(now) and (
                signer is None or (info.signs_from, info.kid)
                > (signer[1].signs_from, signer[1].kid)):
            signer = (key, info)
    if signer is None:
        raise KeyringError(f"no key with a private part signs at {now.isoformat()}")
    return signer[0], signer[1].kid, entries, min(changes, default=None)


def _check_lifetime(max_token_lifetime_s: int) -> None:
    if isinstance(max_token_lifetime_s, bool) or not isinstance(max_token_lifetime_s, int):
        raise TypeError("max_token_lifetime_s must be an int")
    if max_token_lifetime_s <= 0:
        raise ValueError("max_token_lifetime_s must be positive")


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("datetime must be timezone-aware")
    return moment.astimezone(UTC)


def _is_published(entry: _Entry, now: datetime) -> bool:
    return entry.info.not_after is None or now < entry.info.not_after


def _b64url(data: bytes) -> bytes:
    """base64url without padding (RFC 7515 §2)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _generate_key() -> OKPKey:
    return OKPKey.generate_key("Ed25519", private=True, auto_kid=False)


def _make_entry(key: OKPKey, info: KeyInfo) -> _Entry:
    public = key.as_dict(private=False)
    verify_key = OKPKey.import_key(public)
    jwk = {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": str(public["x"]),
        "kid": info.kid,
        "alg": ALGORITHM,
        "use": "sig",
    }
    return _Entry(info=info, verify_key=verify_key, public_jwk=jwk)


def _retire(info: KeyInfo, *, at: datetime, lifetime: timedelta) -> KeyInfo:
    not_after = at + lifetime
    if info.not_after is not None and info.not_after > not_after:
        not_after = info.not_after
    return replace(info, retired_at=at, not_after=not_after)


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise ValueError(f"duplicate member {name!r}")
        result[name] = value
    return result


def _decode_json_segment(segment: str, *, what: str) -> dict[str, Any]:
    """base64url (no padding) → strict JSON object; anything else is ``malformed_permit``."""
    if not _B64URL.fullmatch(segment):
        raise PermitRefused(f"{what} is not base64url", code="malformed_permit")
    try:
        raw = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
        value = json.loads(raw, object_pairs_hook=_reject_duplicates)
    except (binascii.Error, ValueError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise PermitRefused(f"{what} is not valid JSON", code="malformed_permit") from exc
    if not isinstance(value, dict):
        raise PermitRefused(f"{what} is not a JSON object", code="malformed_permit")
    return value


# --- storage ----------------------------------------------------------------------------


def read_key_folder(key_dir: Path) -> list[tuple[OKPKey, KeyInfo]]:
    """Every key file of ``key_dir`` (the pre-database format above), oldest first;
    nothing is written. An absent folder holds no keys.

    Raises:
        KeyringError: a key file is unreadable, foreign, or does not match its kid.
    """
    if not key_dir.is_dir():
        return []
    loaded = [_read_key_file(path) for path in sorted(key_dir.glob("*.json"))]
    return sorted(loaded, key=lambda pair: pair[1].created_at)


def _tighten(path: Path, mode: int) -> None:
    current = path.stat().st_mode & 0o777
    if current & ~mode:
        logger.warning("tightening permissions of %s from %o to %o", path, current, mode)
        path.chmod(mode)


@contextmanager
def _locked(key_dir: Path) -> Iterator[None]:
    """Serialise key-folder writers across processes (advisory ``flock``)."""
    fd = os.open(key_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _parse_time(document: dict[str, Any], name: str, *, path: Path) -> datetime | None:
    value = document.get(name)
    if value is None:
        return None
    try:
        return _utc(datetime.fromisoformat(value))
    except (TypeError, ValueError) as exc:
        raise KeyringError(f"{path.name}: bad {name}") from exc


def _write_key_file(key_dir: Path, key: OKPKey, info: KeyInfo) -> None:
    """Write ``<kid>.json`` atomically (temp file, fsync, rename, fsync folder), mode 0600."""
    document = {
        "format": _FILE_FORMAT,
        "kid": info.kid,
        "created_at": _iso(info.created_at),
        "retired_at": _iso(info.retired_at),
        "not_after": _iso(info.not_after),
        # A retired key never signs again: keep only its public part.
        "jwk": key.as_dict(private=info.retired_at is None),
    }
    data = orjson.dumps(document, option=orjson.OPT_INDENT_2)
    target = key_dir / f"{info.kid}.json"
    tmp = key_dir / f".{info.kid}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(key_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read_key_file(path: Path) -> tuple[OKPKey, KeyInfo]:
    _tighten(path, 0o600)
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise KeyringError(f"{path.name}: unreadable key file") from exc
    if not isinstance(document, dict) or document.get("format") != _FILE_FORMAT:
        raise KeyringError(f"{path.name}: not a Cosigner key file")
    jwk = document.get("jwk")
    if not isinstance(jwk, dict) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
        raise KeyringError(f"{path.name}: not an Ed25519 JWK")
    try:
        key = OKPKey.import_key(jwk)
    except (JoseError, ValueError) as exc:
        raise KeyringError(f"{path.name}: invalid JWK") from exc
    kid = key.thumbprint()
    if document.get("kid") != kid or path.name != f"{kid}.json" or not _KID.fullmatch(kid):
        raise KeyringError(f"{path.name}: kid does not match the key's RFC 7638 thumbprint")
    created_at = _parse_time(document, "created_at", path=path)
    if created_at is None:
        raise KeyringError(f"{path.name}: missing created_at")
    info = KeyInfo(
        kid=kid,
        created_at=created_at,
        retired_at=_parse_time(document, "retired_at", path=path),
        not_after=_parse_time(document, "not_after", path=path),
    )
    if info.retired_at is not None and info.not_after is None:
        raise KeyringError(f"{path.name}: retired key without not_after")
    return key, info
