"""The key folder of earlier versions: one JSON file per key (the upgrade path).

On disk (``key_dir``, mode 0700) each key is ``<kid>.json`` (mode 0600, written atomically)::

    {"format": 1, "kid": ..., "created_at": ISO-8601 UTC, "retired_at": ... | null,
     "not_after": ... | null, "jwk": {...}}

The current key's ``jwk`` is private; a retired key's file keeps only the public JWK, since a
retired key never signs again. ``kid`` is the RFC 7638 thumbprint of the public key and is
checked on load. Serving processes keep their keys in the database
(:mod:`cosigner.keys.store`), which imports a folder once with :func:`read_key_folder`;
:meth:`cosigner.keys.keyring.Keyring.load_or_create` still runs on a folder alone (tests,
offline tools).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from cosigner.keys.ed25519 import Ed25519Key
from cosigner.keys.material import KeyInfo, KeyringError, utc

logger = logging.getLogger(__name__)

_FILE_FORMAT = 1
_KID = re.compile(r"[A-Za-z0-9_-]{43}")  # base64url SHA-256 thumbprint, as we generate them


def read_key_folder(key_dir: Path) -> list[tuple[Ed25519Key, KeyInfo]]:
    """Every key file of ``key_dir`` (the pre-database format above), oldest first;
    nothing is written. An absent folder holds no keys.

    Raises:
        KeyringError: a key file is unreadable, foreign, or does not match its kid.
    """
    if not key_dir.is_dir():
        return []
    loaded = [read_key_file(path) for path in sorted(key_dir.glob("*.json"))]
    return sorted(loaded, key=lambda pair: pair[1].created_at)


def tighten(path: Path, mode: int) -> None:
    current = path.stat().st_mode & 0o777
    if current & ~mode:
        logger.warning("tightening permissions of %s from %o to %o", path, current, mode)
        path.chmod(mode)


@contextmanager
def locked(key_dir: Path) -> Iterator[None]:
    """Serialise key-folder writers across processes (advisory ``flock``)."""
    fd = os.open(key_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def parse_time(document: dict[str, Any], name: str, *, path: Path) -> datetime | None:
    value = document.get(name)
    if value is None:
        return None
    try:
        return utc(datetime.fromisoformat(value))
    except (TypeError, ValueError) as exc:
        raise KeyringError(f"{path.name}: bad {name}") from exc


def write_key_file(key_dir: Path, key: Ed25519Key, info: KeyInfo) -> None:
    """Write ``<kid>.json`` atomically (temp file, fsync, rename, fsync folder), mode 0600."""
    document = {
        "format": _FILE_FORMAT,
        "kid": info.kid,
        "created_at": iso(info.created_at),
        "retired_at": iso(info.retired_at),
        "not_after": iso(info.not_after),
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


def read_key_file(path: Path) -> tuple[Ed25519Key, KeyInfo]:
    tighten(path, 0o600)
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
        key = Ed25519Key.import_key(jwk)
    except ValueError as exc:
        raise KeyringError(f"{path.name}: invalid JWK") from exc
    kid = key.thumbprint()
    if document.get("kid") != kid or path.name != f"{kid}.json" or not _KID.fullmatch(kid):
        raise KeyringError(f"{path.name}: kid does not match the key's RFC 7638 thumbprint")
    created_at = parse_time(document, "created_at", path=path)
    if created_at is None:
        raise KeyringError(f"{path.name}: missing created_at")
    info = KeyInfo(
        kid=kid,
        created_at=created_at,
        retired_at=parse_time(document, "retired_at", path=path),
        not_after=parse_time(document, "not_after", path=path),
    )
    if info.retired_at is not None and info.not_after is None:
        raise KeyringError(f"{path.name}: retired key without not_after")
    return key, info
