"""The signing keyring in the database, shared by every replica (issue 13).

Each key is a row of ``signing_keys`` (:mod:`cosigner.db.tables_keys`): the public key in
clear, the private key sealed with AES-256-GCM under the key-encryption key (KEK) with the
kid as associated data, so a sealed key moved to another row does not open.

The KEK comes from ``COSIGNER_KEY_ENCRYPTION_KEY``; without it, a KEK file is generated
(mode 0600) in ``key_dir`` on first start, which is right for one process only: replicas
must share the setting. A wrong KEK refuses to start with :class:`KeyringError`.

Rotation (:meth:`KeyStore.rotate`, ``cosigner keys rotate``) inserts a key that is
published at once and signs only from ``now + key_activation_delay_s``; every replica
reloads the keys within ``replica_poll_s`` of the change (:class:`KeyringFollower`), so it
publishes the new key before any replica signs with it. The keys it retires stay published
until ``retired_at + max token lifetime + activation delay`` (a replica may switch one poll
late). A verifier meeting an unknown kid reloads once (at most once a second) first.

Key files of older versions in ``key_dir`` are imported once, when the table is empty.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import delete, select, text

from cosigner.core.clock import Clock
from cosigner.core.settings import Settings, decode_kek
from cosigner.db import generations
from cosigner.db.database import Database
from cosigner.db.tables_keys import signing_keys
from cosigner.keys.ed25519 import Ed25519Key, aes256gcm_decrypt, aes256gcm_encrypt
from cosigner.keys.folder import read_key_folder
from cosigner.keys.keyring import ALGORITHM, KeyInfo, Keyring, KeyringError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["KEK_FILE", "KeyStore", "KeyringFollower", "Rotation", "load_kek", "open_keyring"]

log = logging.getLogger("cosigner.keys")

KEK_FILE = "key-encryption-key"
"""Name of the generated KEK file in ``key_dir`` (used when no KEK is configured)."""

_NONCE_BYTES = 12
_UNKNOWN_KID_REFRESH_S = 1.0  # at most one reload a second for unknown kids


def load_kek(settings: Settings) -> bytes:
    """The 32-byte KEK: the setting, else ``key_dir/key-encryption-key`` (created 0600).

    Raises:
        KeyringError: the KEK file is unreadable or not 32 bytes of base64url.
    """
    if settings.key_encryption_key is not None:
        return decode_kek(settings.key_encryption_key.get_secret_value())
    path = settings.key_dir / KEK_FILE
    settings.key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as handle:
            handle.write(base64.urlsafe_b64encode(os.urandom(32)).decode() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        log.warning("generated a key-encryption key in %s; replicas must share one "
                    "COSIGNER_KEY_ENCRYPTION_KEY instead", path)
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)
    try:
        return decode_kek(path.read_text())
    except (OSError, ValueError) as exc:
        raise KeyringError(f"{path}: not a key-encryption key (32 bytes, base64url)") from exc


def seal(kek: bytes, kid: str, private: bytes) -> bytes:
    """AES-256-GCM of ``private`` with a random nonce, the kid as associated data."""
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + aes256gcm_encrypt(kek, nonce, private, kid.encode())


def unseal(kek: bytes, kid: str, sealed: bytes) -> bytes:
    """Inverse of :func:`seal`. Raises :class:`KeyringError` when the KEK (or the row)
    is not the one it was sealed with."""
    try:
        if len(sealed) < _NONCE_BYTES:
            raise ValueError("sealed key shorter than its nonce")
        return aes256gcm_decrypt(kek, sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:],
                                 kid.encode())
    except ValueError as exc:
        raise KeyringError(
            f"cannot decrypt signing key {kid}: the key-encryption key "
            "(COSIGNER_KEY_ENCRYPTION_KEY, or key_dir/key-encryption-key) is not the one "
            "it was stored with; every replica needs the same one") from exc


@dataclass(frozen=True, slots=True)
class Rotation:
    """What :meth:`KeyStore.rotate` did (times UTC)."""

    old_kid: str
    new_kid: str
    activates_at: datetime


class KeyStore:
    """Reads and writes the keyring rows; decrypted private keys are kept by kid."""

    def __init__(self, db: Database, *, kek: bytes, max_token_lifetime_s: int,
                 activation_delay_s: float, key_dir: Path | None = None,
                 alg: str = ALGORITHM) -> None:
        """``alg``: the JWS alg of keys created from now on (existing keys keep theirs)."""
        self._db = db
        self._alg = alg
        self._kek = kek
        self._lifetime = timedelta(seconds=max_token_lifetime_s)
        self._delay = timedelta(seconds=activation_delay_s)
        self._key_dir = key_dir
        self._opened: dict[str, Ed25519Key] = {}  # kid → key as last built from its row

    @property
    def max_token_lifetime_s(self) -> int:
        return int(self._lifetime.total_seconds())

    async def open(self, *, now: datetime) -> Keyring:
        """The keyring at ``now``; first imports ``key_dir``'s key files (table empty)
        and creates a key when none can sign at ``now``.

        Raises:
            KeyringError: wrong KEK, a corrupt row or key file.
            Unavailable: the database cannot be reached.
        """
        async with self._db.transaction() as conn:
            await _lock(conn)
            has_rows = (await conn.execute(select(signing_keys.c.kid).limit(1))).first()
            if has_rows is None and self._key_dir is not None:
                await self._import_files(conn, now)
            keys = await self._read(conn)
            if not any(key.is_private and info.signs_at(now) for key, info in keys):
                await self._insert(conn, _new_key(), created_at=now, activates_at=now,
                                   alg=self._alg)
                await generations.bump(conn, generations.SIGNING_KEYS)
            await self._prune(conn, now)
            keys = await self._read(conn)
        return Keyring.from_keys(keys, now=now, max_token_lifetime_s=self.max_token_lifetime_s)

    async def load(self) -> list[tuple[Ed25519Key, KeyInfo]]:
        """Every stored key (for :meth:`Keyring.install`)."""
        async with self._db.read() as conn:
            return await self._read(conn)

    async def rotate(self, *, now: datetime) -> Rotation:
        """Insert a new key that signs from ``now + activation delay`` and retire, at that
        instant, every key that would sign after it.

        Raises:
            KeyringError: no key signs at ``now`` (run the server once first), wrong KEK.
            Unavailable: the database cannot be reached.
        """
        activates_at = now + self._delay
        async with self._db.transaction() as conn:
            await _lock(conn)
            keys = await self._read(conn)
            signing = [info for key, info in keys if key.is_private and info.signs_at(now)]
            if not signing:
                raise KeyringError("no signing key in the database to rotate from")
            old = max(signing, key=lambda info: (info.signs_from, info.kid))
            for _, info in keys:
                if info.retired_at is None or info.retired_at > activates_at:
                    await conn.execute(signing_keys.update()
                                       .where(signing_keys.c.kid == info.kid)
                                       .values(retired_at=activates_at,
                                               not_after=self._not_after(activates_at)))
            new_key = _new_key()
            await self._insert(conn, new_key, created_at=now, activates_at=activates_at,
                               alg=self._alg)
            await self._prune(conn, now)
            await generations.bump(conn, generations.SIGNING_KEYS)
        return Rotation(old_kid=old.kid, new_kid=new_key.thumbprint(),
                        activates_at=activates_at)

    def _not_after(self, retired_at: datetime) -> datetime:
        return retired_at + self._lifetime + self._delay

    async def _insert(self, conn: AsyncConnection, key: Ed25519Key, *, created_at: datetime,
                      activates_at: datetime, retired_at: datetime | None = None,
                      not_after: datetime | None = None, alg: str = ALGORITHM) -> None:
        kid = key.thumbprint()
        sealed = None
        if key.is_private and retired_at is None:
            assert key.seed is not None
            sealed = seal(self._kek, kid, key.seed)
        await conn.execute(signing_keys.insert().values(
            kid=kid, x=str(key.as_dict(private=False)["x"]), private_sealed=sealed,
            created_at=created_at, activates_at=activates_at, retired_at=retired_at,
            not_after=not_after, alg=alg))

    async def _import_files(self, conn: AsyncConnection, now: datetime) -> None:
        assert self._key_dir is not None
        loaded = read_key_folder(self._key_dir)
        if not loaded:
            return
        unretired = [info for _, info in loaded if info.retired_at is None]
        newest = max(unretired, key=lambda info: info.created_at) if unretired else None
        for key, info in loaded:
            retired_at, not_after = info.retired_at, info.not_after
            if retired_at is None and newest is not None and info.kid != newest.kid:
                retired_at = newest.created_at  # an interrupted rotation, as on load
            if retired_at is not None:
                not_after = max(not_after or retired_at, retired_at + self._lifetime)
            await self._insert(conn, key, created_at=info.created_at,
                               activates_at=info.created_at, retired_at=retired_at,
                               not_after=not_after)
        await generations.bump(conn, generations.SIGNING_KEYS)
        log.warning("imported %d signing key file(s) from %s into the database; the files "
                    "are no longer read", len(loaded), self._key_dir)

    async def _prune(self, conn: AsyncConnection, now: datetime) -> None:
        """Drop keys past ``not_after``; forget the private part of retired keys."""
        await conn.execute(delete(signing_keys).where(signing_keys.c.not_after <= now))
        await conn.execute(signing_keys.update().where(
            signing_keys.c.retired_at <= now, signing_keys.c.private_sealed.is_not(None))
            .values(private_sealed=None))

    async def _read(self, conn: AsyncConnection) -> list[tuple[Ed25519Key, KeyInfo]]:
        rows = (await conn.execute(select(signing_keys))).all()
        result = []
        for row in rows:
            info = KeyInfo(kid=row.kid, created_at=_aware(row.created_at),
                           activates_at=_aware(row.activates_at),
                           retired_at=_aware_or_none(row.retired_at),
                           not_after=_aware_or_none(row.not_after), alg=row.alg)
            result.append((self._key_of(row.kid, row.x, row.private_sealed), info))
        return result

    def _key_of(self, kid: str, x: str, sealed: bytes | None) -> Ed25519Key:
        known = self._opened.get(kid)
        if known is not None and (sealed is None or known.is_private):
            return known if sealed is not None else _public(known)
        jwk: dict[str, str | list[str]] = {"kty": "OKP", "crv": "Ed25519", "x": x}
        if sealed is not None:
            private = unseal(self._kek, kid, bytes(sealed))
            jwk["d"] = base64.urlsafe_b64encode(private).rstrip(b"=").decode()
        try:
            key = Ed25519Key.import_key(jwk)
        except ValueError as exc:
            raise KeyringError(f"signing key {kid}: invalid key in the database") from exc
        if key.thumbprint() != kid:
            raise KeyringError(f"signing key {kid}: kid does not match the key")
        self._opened[kid] = key
        return key


class KeyringFollower:
    """Keeps one process's keyring equal to the database's (driven by
    :class:`cosigner.db.replica_sync.ReplicaSync`)."""

    def __init__(self, store: KeyStore, keyring: Keyring, clock: Clock) -> None:
        self._store = store
        self._keyring = keyring
        self._clock = clock
        self._generation: int | None = None
        self._last_unknown_kid = -_UNKNOWN_KID_REFRESH_S
        self._reloading: asyncio.Task[None] | None = None
        keyring.on_unknown_kid(self._refresh_for_unknown_kid)

    async def observe(self, generation: int, now: datetime) -> None:
        """Reload when the keys' generation moved, else re-plan at ``now`` (a pending key
        starts signing, an old one stops being published)."""
        if generation != self._generation:
            keys = await self._store.load()
            self._keyring.install(keys, now=now)
            self._generation = generation
            log.info("signing keys reloaded (generation %d): current kid %s", generation,
                     self._keyring.current_kid)
        else:
            self._keyring.advance(now=now)

    async def _refresh_for_unknown_kid(self) -> bool:
        if self._reloading is None:
            if time.monotonic() - self._last_unknown_kid < _UNKNOWN_KID_REFRESH_S:
                return False
            self._last_unknown_kid = time.monotonic()
            self._reloading = asyncio.create_task(self._reload())
        task = self._reloading
        try:
            await asyncio.shield(task)
        finally:
            if task.done():
                self._reloading = None
        return True

    async def _reload(self) -> None:
        keys = await self._store.load()
        self._keyring.install(keys, now=self._clock())


async def open_keyring(db: Database, settings: Settings, *, now: datetime
                       ) -> tuple[KeyStore, Keyring]:
    """The database keyring for ``settings`` (what serve and the CLI use)."""
    store = KeyStore(db, kek=load_kek(settings), max_token_lifetime_s=settings.max_permit_ttl_s,
                     activation_delay_s=settings.key_activation_delay_s,
                     key_dir=settings.key_dir, alg=settings.signing_alg)
    return store, await store.open(now=now)


async def _lock(conn: AsyncConnection) -> None:
    """Serialise keyring writers (PostgreSQL; SQLite's BEGIN IMMEDIATE already does)."""
    if conn.dialect.name == "postgresql":
        await conn.execute(text("LOCK TABLE signing_keys IN SHARE ROW EXCLUSIVE MODE"))


def _new_key() -> Ed25519Key:
    return Ed25519Key.generate()


def _public(key: Ed25519Key) -> Ed25519Key:
    return key.public()


def _aware(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _aware_or_none(value: datetime | None) -> datetime | None:
    return None if value is None else _aware(value)
