"""Ed25519 signing keyring: compact JWS sign/verify, JWKS, rotation.

One key signs (the *current* key); retired keys only verify, and stay published in the JWKS
until every token they could have signed has expired (``not_after = retired_at + max token
lifetime``). After that they are dropped from memory and disk.

The JWS algorithm is pinned per key: ``"Ed25519"`` (RFC 9864, the fully-specified identifier
that deprecates ``EdDSA``) by default, or ``"EdDSA"`` for keys created with
``COSIGNER_SIGNING_ALG=EdDSA`` (the same signature, for executors whose library lacks the new
name); the JWKS says which. :meth:`Keyring.verify` reads the protected header itself before any
library call: the algorithm is compared exactly with the key's own, ``kid`` is only a
dictionary key (never a path, never a URL), and nothing in a token chooses how it is verified
(case K17): a key never accepts both names.

On disk (a key folder, :mod:`cosigner.keys.folder`) or in the database
(:mod:`cosigner.keys.store`).

The serving processes keep their keys in the database instead (:mod:`cosigner.keys.store`),
and build the keyring with :meth:`Keyring.from_keys`: every key there carries an
``activates_at``, so a new key is published at once but signs only from that instant, and
:meth:`Keyring.advance` / :meth:`Keyring.install` move the keyring along that plan. The
folder format stays the upgrade path (:mod:`cosigner.keys.folder`).
"""

from __future__ import annotations

import binascii
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import orjson

from cosigner.core import fastjson
from cosigner.core.errors import PermitRefused
from cosigner.keys.ed25519 import Ed25519Key, ed25519_signer, public_of
from cosigner.keys.folder import locked, read_key_file, tighten, write_key_file
from cosigner.keys.material import (
    ALGORITHM,
    ALGORITHMS,
    Entry,
    KeyInfo,
    KeyringError,
    check_lifetime,
    generate_key,
    is_published,
    make_entry,
    retire,
    utc,
)
from cosigner.keys.signed_memo import SignedMemo

__all__ = ["ALGORITHM", "ALGORITHMS", "KeyInfo", "Keyring", "KeyringError", "MAX_TOKEN_CHARS",
           "decode_payload"]

logger = logging.getLogger(__name__)

MAX_TOKEN_CHARS = 16_384
"""Longer tokens are refused before any decoding (permits are a few hundred bytes)."""

_HEADER_MEMBERS = frozenset({"alg", "kid", "typ"})
#: Decoded header segments (every token of one key and type has the same one; decoding is
#: a pure function of the segment, so a remembered result is the result). Read-only.
_HEADERS: dict[str, dict[str, Any]] = {}
_MAX_HEADERS = 64
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
T = TypeVar("T")


class Keyring:
    """Current Ed25519 signing key plus the retired keys still published.

    Build with :meth:`load_or_create` (persistent) or :meth:`ephemeral` (tests). Keys are parsed
    once; :meth:`sign` and :meth:`verify` do no I/O.
    """

    def __init__(
        self,
        *,
        signing_key: Ed25519Key,
        entries: dict[str, Entry],
        current_kid: str,
        max_token_lifetime_s: int,
        key_dir: Path | None,
    ) -> None:
        self._signing_key = signing_key
        # (kid, typ) → (encoded header, its JSON)
        self._headers: dict[tuple[str, str], tuple[bytes, bytes]] = {}
        # kid → (ed25519_signer, its raw public key)
        self._signers: dict[str, tuple[Callable[[bytes], bytes], bytes]] = {}
        #: Signatures made here lately: verify() skips libsodium for them (signed_memo).
        self._signed = SignedMemo()
        self._entries = entries
        self._current_kid = current_kid
        self._max_lifetime = timedelta(seconds=max_token_lifetime_s)
        self._max_lifetime_s = int(self._max_lifetime.total_seconds())  # read per permit
        self._key_dir = key_dir
        # Keys held by a keyring built with from_keys(): re-planned by advance()/install().
        self._material: tuple[tuple[Ed25519Key, KeyInfo], ...] = ()
        self._next_change: datetime | None = None
        self._refresh: Callable[[], Awaitable[bool]] | None = None

    # --- construction -------------------------------------------------------------------

    @classmethod
    def ephemeral(cls, *, now: datetime, max_token_lifetime_s: int = 3600,
                  alg: str = ALGORITHM) -> Keyring:
        """An in-memory keyring with one fresh key (``alg``); nothing touches the disk."""
        check_lifetime(max_token_lifetime_s)
        key = generate_key()
        entry = make_entry(key, KeyInfo(kid=key.thumbprint(), created_at=utc(now), alg=alg))
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
        check_lifetime(max_token_lifetime_s)
        now = utc(now)
        lifetime = timedelta(seconds=max_token_lifetime_s)
        key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        tighten(key_dir, 0o700)
        with locked(key_dir):
            loaded = [read_key_file(path) for path in sorted(key_dir.glob("*.json"))]
            for path in key_dir.glob(".*.tmp"):  # leftovers of an interrupted write
                path.unlink(missing_ok=True)

            unretired = [(k, i) for k, i in loaded if i.retired_at is None]
            unretired.sort(key=lambda pair: pair[1].created_at)
            if unretired:
                signing_key, current = unretired[-1]
            else:
                signing_key = generate_key()
                current = KeyInfo(kid=signing_key.thumbprint(), created_at=now)
                write_key_file(key_dir, signing_key, current)
            if not signing_key.is_private:
                raise KeyringError(f"current key {current.kid} has no private part")
            _check_pair(signing_key, current.kid)

            entries: dict[str, Entry] = {current.kid: make_entry(signing_key, current)}
            for key, info in loaded:
                if info.kid == current.kid:
                    continue
                if info.retired_at is None:  # older unretired key: finish its retirement
                    info = retire(info, at=current.created_at, lifetime=lifetime)
                    write_key_file(key_dir, key, info)
                else:  # honour a longer lifetime configured since the key was retired
                    info = retire(info, at=info.retired_at, lifetime=lifetime)
                assert info.not_after is not None
                if info.not_after <= now:
                    (key_dir / f"{info.kid}.json").unlink(missing_ok=True)
                    continue
                entries[info.kid] = make_entry(key, info)
        return cls(
            signing_key=signing_key,
            entries=entries,
            current_kid=current.kid,
            max_token_lifetime_s=max_token_lifetime_s,
            key_dir=key_dir,
        )

    @classmethod
    def from_keys(cls, keys: Sequence[tuple[Ed25519Key, KeyInfo]], *, now: datetime,
                  max_token_lifetime_s: int) -> Keyring:
        """A keyring over ``keys`` (private or public-only OKP keys with their metadata).

        At ``now`` it publishes every key whose ``not_after`` has not passed (keys not yet
        active included) and signs with the private key that :meth:`KeyInfo.signs_at`
        ``now`` and activated last (ties: greatest kid).

        Raises:
            KeyringError: no key with a private part signs at ``now``.
        """
        check_lifetime(max_token_lifetime_s)
        signing_key, current_kid, entries, next_change = _plan(keys, utc(now))
        keyring = cls(signing_key=signing_key, entries=entries, current_kid=current_kid,
                      max_token_lifetime_s=max_token_lifetime_s, key_dir=None)
        keyring._material, keyring._next_change = tuple(keys), next_change
        return keyring

    def install(self, keys: Sequence[tuple[Ed25519Key, KeyInfo]], *, now: datetime) -> None:
        """Replace the keys held by ``keys`` (a reload from storage), planned at ``now``
        as in :meth:`from_keys`. Raises :class:`KeyringError` like it, changing nothing."""
        signing_key, current_kid, entries, next_change = _plan(keys, utc(now))
        self._swap(signing_key, current_kid, entries)
        self._material, self._next_change = tuple(keys), next_change

    def advance(self, *, now: datetime) -> bool:
        """Re-plan the keys held at ``now`` when an activation, retirement or expiry has
        come due since the last plan; True when the plan changed."""
        now = utc(now)
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

    def _swap(self, signing_key: Ed25519Key, current_kid: str, entries: dict[str, Entry]) -> None:
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
        now = utc(now)
        new_key = generate_key()
        old_entry = self._entries[self._current_kid]
        new_info = KeyInfo(kid=new_key.thumbprint(), created_at=now, alg=old_entry.info.alg)
        old_info = retire(old_entry.info, at=now, lifetime=self._max_lifetime)
        if self._key_dir is not None:
            with locked(self._key_dir):
                write_key_file(self._key_dir, new_key, new_info)
                write_key_file(self._key_dir, old_entry.verify_key, old_info)
        entries = {kid: e for kid, e in self._entries.items() if is_published(e, now)}
        entries[old_info.kid] = replace(old_entry, info=old_info)
        entries[new_info.kid] = make_entry(new_key, new_info)
        # Swap whole objects (no in-place mutation) so a concurrent verify sees a consistent map.
        self._swap(new_key, new_info.kid, entries)
        return new_info.kid

    # --- introspection ------------------------------------------------------------------

    @property
    def current_kid(self) -> str:
        return self._current_kid

    @property
    def max_token_lifetime_s(self) -> int:
        return self._max_lifetime_s

    def keys(self) -> list[KeyInfo]:
        """Metadata of every key held (current first, then unretired, then retired)."""
        infos = [entry.info for entry in self._entries.values()]
        return sorted(infos, key=lambda info: (info.kid != self._current_kid,
                                               info.retired_at is not None))

    def jwks(self, *, now: datetime) -> dict[str, list[dict[str, str]]]:
        """The JWK Set to publish: ``{"keys": [{kty, crv, x, kid, alg, use}, ...]}``.

        Holds the current key and every retired key with ``not_after > now``.
        """
        return {"keys": [dict(entry.public_jwk) for entry in self._published(utc(now))]}

    def _published(self, now: datetime) -> Iterator[Entry]:
        return (entry for entry in self._entries.values() if is_published(entry, now))

    # --- sign / verify ------------------------------------------------------------------

    def sign(self, claims: dict[str, Any], *, typ: str) -> str:
        """Compact JWS of ``claims`` (compact JSON) with the current key.

        Protected header: exactly ``{"alg": <the key's alg>, "kid": <current kid>, "typ":
        typ}``.
        """
        return self.sign_parts(claims, typ=typ)[0]

    def sign_parts(self, claims: dict[str, Any], *, typ: str, attach: object = None
                   ) -> tuple[str, bytes, bytes, bytes]:
        """:meth:`sign`, with what its three segments spell: ``(token, header JSON,
        claims JSON, raw 64-byte signature)`` (each segment is the unpadded base64url of
        exactly those bytes), so a caller storing the token decoded need not decode it.

        ``attach``: an object :meth:`verify_recalled` gives back for this exact token in
        place of its decoded payload; it must be what the caller would make of that
        payload (the caller's parse of it), and is never modified afterwards."""
        # RFC 7515 §7.1 composed here (Ed25519 is deterministic; libsodium or cryptography,
        # cosigner.keys.ed25519): joserfc's serialize_compact gives the same bytes, at several
        # times the cost on the decision path (tests/test_keys.py compares the two).
        key, kid = self._signing_key, self._current_kid
        header = self._headers.get((kid, typ))
        if header is None:
            header_json = orjson.dumps(
                {"alg": self._entries[kid].info.alg, "kid": kid, "typ": typ})
            header = self._headers[(kid, typ)] = (_b64url(header_json), header_json)
        payload = orjson.dumps(claims)
        signing_input = header[0] + b"." + _b64url(payload)
        signer = self._signers.get(kid)
        if signer is None:  # the kid is the key's thumbprint: one signer per kid
            if key.seed is None:
                raise KeyringError("the current signing key is not an Ed25519 private key")
            signer = self._signers[kid] = (ed25519_signer(key.seed), public_of(key.seed))
        raw_signature = signer[0](signing_input)
        encoded = _b64url(raw_signature)
        signature = encoded.decode("ascii")
        self._signed.remember(signature, signer[1], signing_input, attach)
        return ((signing_input + b"." + encoded).decode("ascii"), header[1], payload,
                raw_signature)

    def verify(self, token: str, *, typ: str, now: datetime | None = None) -> dict[str, Any]:
        """Verify a compact JWS made by this keyring and return its claims.

        The header is parsed here, before the JOSE library sees the token: it must hold exactly
        ``alg``, ``kid`` and ``typ``; ``kid`` must name a key held in memory (with ``now``, one
        still published at ``now``); ``alg`` must equal that key's own alg exactly; ``typ``
        must equal ``typ``. Only then is the signature checked with that key and that
        algorithm.

        Raises:
            PermitRefused: ``malformed_permit`` (not a compact JWS, bad base64url/JSON, duplicate
                or unexpected header members, payload not a JSON object), ``bad_signature``
                (any other ``alg``, signature invalid), ``unknown_kid``,
                ``wrong_token_type``.
        """
        segments, _ = self._verified(token, typ, now)
        # Parse the payload segment ourselves, with the same strict JSON rules as the header.
        return _decode_json_segment(segments[1], what="payload")

    def verify_recalled(self, token: str, *, typ: str, kind: type[T],
                        now: datetime | None = None,
                        vouch: Callable[[str], object] | None = None
                        ) -> dict[str, Any] | T:
        """:meth:`verify`, or the object of type ``kind`` attached to the token's signature
        when this process signed exactly this token with one (:meth:`sign_parts`'
        ``attach``): its payload is then not decoded again. Every other check of
        :meth:`verify` runs either way (the payload is then this process's own JSON).

        ``vouch``: asked, after every check of the header and before the signature is
        checked (when this process's memo does not hold it), with the token's payload
        segment; it returns an object when the caller knows that this exact token (all
        three segments) was made by this keyring, e.g. from a digest of the token
        recorded when it was minted (cosigner.permits.redeem), else ``None``. With an
        object, the signature check is skipped and the object stands for the payload as
        the memo's does (of type ``kind``, it is returned). What ``vouch`` raises
        propagates.

        Raises:
            PermitRefused: as :meth:`verify`.
        """
        segments, attached = self._verified(token, typ, now, vouch)
        if isinstance(attached, kind):
            return attached
        return _decode_json_segment(segments[1], what="payload")

    def _verified(self, token: str, typ: str, now: datetime | None,
                  vouch: Callable[[str], object] | None = None
                  ) -> tuple[list[str], object]:
        """The token's three segments once every check of :meth:`verify` but the
        payload's decoding passed, and the object attached to its signature here (or
        given by ``vouch``, :meth:`verify_recalled`)."""
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            raise PermitRefused("token is not a compact JWS", code="malformed_permit")
        segments = token.split(".")
        if len(segments) != 3:
            raise PermitRefused("token is not a compact JWS", code="malformed_permit")
        header = _HEADERS.get(segments[0])
        if header is None:
            header = _decode_json_segment(segments[0], what="header")
            if len(_HEADERS) >= _MAX_HEADERS:
                _HEADERS.clear()
            _HEADERS[segments[0]] = header

        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in ALGORITHMS:
            raise PermitRefused("algorithm not accepted", code="bad_signature")
        if header.keys() != _HEADER_MEMBERS:
            raise PermitRefused("unexpected JWS header members", code="malformed_permit")
        kid = header["kid"]
        if not isinstance(kid, str):
            raise PermitRefused("kid is not a string", code="malformed_permit")
        entry = self._entries.get(kid)
        if entry is None or (now is not None and not is_published(entry, utc(now))):
            raise PermitRefused("signing key is not known", code="unknown_kid")
        if alg != entry.info.alg:  # pinned per key: never both names for one key (K17)
            raise PermitRefused("algorithm not accepted for this key", code="bad_signature")
        if header["typ"] != typ:
            raise PermitRefused("token type not accepted here", code="wrong_token_type")

        # Both names are one signature (Ed25519, RFC 8032; "EdDSA" per RFC 8037 §3.1),
        # checked directly (libsodium or cryptography): the header is already checked above, and
        # joserfc's compact deserialisation re-parsed it at several times the cost on the
        # redeem path (issue 20; tests/keys compare the outcomes with joserfc's).
        return segments, _verify_eddsa(entry, segments, self._signed, vouch)


# --- helpers ----------------------------------------------------------------------------


def _plan(keys: Sequence[tuple[Ed25519Key, KeyInfo]], now: datetime
          ) -> tuple[Ed25519Key, str, dict[str, Entry], datetime | None]:
    """(signing key, its kid, published entries, next instant the plan changes) at ``now``."""
    entries: dict[str, Entry] = {}
    signer: tuple[Ed25519Key, KeyInfo] | None = None
    changes: list[datetime] = []
    for key, info in keys:
        if info.not_after is not None and info.not_after <= now:
            continue
        entries[info.kid] = make_entry(key, info)
        changes += [t for t in (info.activates_at, info.retired_at, info.not_after)
                    if t is not None and t > now]
        if key.is_private and info.signs_at(now) and (
                signer is None or (info.signs_from, info.kid)
                > (signer[1].signs_from, signer[1].kid)):
            signer = (key, info)
    if signer is None:
        raise KeyringError(f"no key with a private part signs at {now.isoformat()}")
    return signer[0], signer[1].kid, entries, min(changes, default=None)


def _verify_eddsa(entry: Entry, segments: list[str], signed: SignedMemo,
                  vouch: Callable[[str], object] | None = None) -> object:
    """The Ed25519 signature of an ``Ed25519`` or ``EdDSA`` token (RFC 8037 §3.1: the same
    signature), checked with the entry's own check (libsodium or cryptography directly,
    :func:`cosigner.keys.material.ed25519_verifier`), unless ``signed`` holds it (this
    process made exactly that signature of exactly that input with the entry's key) or
    ``vouch`` returns an object for the payload segment (the caller knows this exact
    token was minted here, :meth:`Keyring.verify_recalled`). Returns the object
    ``signed`` holds with the signature or ``vouch`` returned (``None``: none)."""
    if not _B64URL.fullmatch(segments[2]):
        raise PermitRefused("signature is not base64url", code="malformed_permit")
    if entry.check is None:  # not an Ed25519 key
        raise PermitRefused("signature verification failed", code="bad_signature")
    try:
        message = f"{segments[0]}.{segments[1]}".encode("ascii")
        vouched, attached = signed.recall(segments[2], entry.verify_key.x, message)
        if vouched:
            return attached
        if vouch is not None:
            attached = vouch(segments[1])
            if attached is not None:
                return attached
        valid = entry.check(_b64url_decode(segments[2]), message)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise PermitRefused("signature verification failed", code="bad_signature") from exc
    if not valid:
        raise PermitRefused("signature verification failed", code="bad_signature")
    return None


#: base64's own translations between the standard and the URL-safe alphabets.
_TO_URL = bytes.maketrans(b"+/", b"-_")
_FROM_URL = bytes.maketrans(b"-_", b"+/")


def _b64url(data: bytes) -> bytes:
    """base64url without padding (RFC 7515 §2): ``base64.urlsafe_b64encode(data)`` less
    its ``=`` (which is ``b2a_base64`` then this translation) without its two calls."""
    return binascii.b2a_base64(data, newline=False).translate(_TO_URL).rstrip(b"=")


def _b64url_decode(segment: str) -> bytes:
    """base64url without padding, canonical only (RFC 4648 §3.5): the unused low bits of
    the last character must be zero, so one token has exactly one spelling (joserfc refuses
    the other spellings too; tests/keys/test_signer.py compares the two).

    Raises:
        binascii.Error: not base64url, or a non-canonical last character.
    """
    text = segment.encode("ascii")  # callers passed it through _B64URL: ASCII only
    raw = binascii.a2b_base64(text.translate(_FROM_URL) + b"=" * (-len(text) % 4))
    if _b64url(raw) != text:
        raise binascii.Error("non-canonical base64url")
    return raw


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise ValueError(f"duplicate member {name!r}")
        result[name] = value
    return result


def _strict_json(raw: bytes) -> Any:
    """The stdlib parser with duplicate members refused: what a JOSE segment must be.
    :func:`cosigner.core.fastjson.loads` answers first where it proves the same value
    (no duplicate, no ``\\u`` escape, safe numbers; tests/keys/test_keyring.py compares
    the two with hypothesis).

    Raises:
        ValueError: not JSON (``JSONDecodeError``, ``UnicodeDecodeError``), or a member
            repeats.
    """
    return json.loads(raw, object_pairs_hook=_reject_duplicates)


def decode_payload(segment: str) -> dict[str, Any]:
    """A token's payload segment as :meth:`Keyring.verify` decodes it once the signature
    is checked: base64url without padding (RFC 7515 §2, canonical spelling only) holding a
    strict JSON object (duplicate members, NaN and out-of-range numbers refused).

    Raises:
        PermitRefused: ``malformed_permit``.
    """
    return _decode_json_segment(segment, what="payload")


def _decode_json_segment(segment: str, *, what: str) -> dict[str, Any]:
    """base64url (no padding) → strict JSON object; anything else is ``malformed_permit``."""
    if not _B64URL.fullmatch(segment):
        raise PermitRefused(f"{what} is not base64url", code="malformed_permit")
    try:
        raw = _b64url_decode(segment)
        proven, value = fastjson.loads(raw)
        if not proven:
            value = _strict_json(raw)
    except (binascii.Error, ValueError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise PermitRefused(f"{what} is not valid JSON", code="malformed_permit") from exc
    if not isinstance(value, dict):
        raise PermitRefused(f"{what} is not a JSON object", code="malformed_permit")
    return value


def _check_pair(key: Ed25519Key, kid: str) -> None:
    """Refuse a signing key whose published ``x`` is not the public key of its ``d``:
    every permit it signed would fail verification (fail closed, but only at the first
    redeem), so the server refuses to start instead.

    Raises:
        KeyringError: ``x`` is malformed or belongs to another key.
    """
    try:
        matches = key.seed is not None and public_of(key.seed) == key.x
    except ValueError as exc:
        raise KeyringError(f"key {kid}: x is not a 32-byte Ed25519 public key") from exc
    if not matches:
        raise KeyringError(f"key {kid}: x is not the public key of d")
