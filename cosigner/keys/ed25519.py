"""Ed25519 keys as JWKs (RFC 8037 ``OKP``), signing and AES-256-GCM sealing on libsodium.

The serving process signs permits, verifies them and unseals its keys at startup; with
PyNaCl installed none of that imports ``cryptography`` or ``joserfc`` (≈ 9 MB of resident
memory, issue 20). Without PyNaCl (or without AES-NI for the sealing) every operation
runs on ``cryptography``, with the same bytes: Ed25519 (RFC 8032) is deterministic and
AES-GCM's output is a function of key, nonce, associated data and plaintext
(tests/keys compare both against ``cryptography`` and :class:`Ed25519Key` against
joserfc's ``OKPKey``).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, cast

__all__ = ["Ed25519Key", "aes256gcm_decrypt", "aes256gcm_encrypt", "ed25519_signer",
           "ed25519_verifier"]

_RAW_BYTES = 32
_PLAIN_MEMBERS = frozenset({"kty", "crv", "x", "d"})


def b64url_decode(text: str) -> bytes:
    """Canonical unpadded base64url (what joserfc accepts in a JWK member).

    Raises:
        binascii.Error: another alphabet, padding, or a non-canonical last character.
    """
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if base64.urlsafe_b64encode(raw).rstrip(b"=") != text.encode("ascii", "replace"):
        raise binascii.Error("not canonical base64url")
    return raw


def _raw32(text: str) -> bytes:
    raw = b64url_decode(text)
    if len(raw) != _RAW_BYTES:
        raise ValueError("An Ed25519 key is 32 bytes long")
    return raw


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


class Ed25519Key:
    """One Ed25519 key as a JWK: the public key ``x`` and, for a private key, the seed ``d``.

    Behaves as joserfc's ``OKPKey`` does for the members Cosigner uses (same
    :meth:`as_dict`, :meth:`thumbprint`, :attr:`is_private`, same keys accepted by
    :meth:`import_key`); ``x`` is taken as given (not derived from ``d``), as joserfc does.
    """

    __slots__ = ("_jwk", "_x", "seed")

    def __init__(self, jwk: dict[str, Any], x: bytes | None, seed: bytes | None) -> None:
        self._jwk = jwk
        self._x = x
        self.seed = seed
        """The raw 32-byte private seed (RFC 8032 §5.1.5), None for a public key."""

    @classmethod
    def generate(cls) -> Ed25519Key:
        """A new private key from 32 random bytes (the OS's generator)."""
        seed = os.urandom(_RAW_BYTES)
        x = public_of(seed)
        return cls({"crv": "Ed25519", "x": _b64url(x), "d": _b64url(seed), "kty": "OKP"},
                   x, seed)

    @classmethod
    def import_key(cls, jwk: Mapping[str, Any]) -> Ed25519Key:
        """The key of a JWK ``{"kty": "OKP", "crv": "Ed25519", "x": …[, "d": …]}``.

        A JWK with other members is checked by joserfc's ``OKPKey.import_key`` first (its
        rules for ``kid``, ``use``, ``key_ops`` …), so every JWK refused before still is.

        Raises:
            ValueError: a member missing or not a string, not canonical base64url, not 32
                bytes, not an Ed25519 OKP key (or joserfc's ``JoseError``, as ValueError).
        """
        if not isinstance(jwk.get("kty"), str):
            raise ValueError("'kty' is required")  # joserfc's rule (its value is replaced)
        data = {**jwk, "kty": "OKP"}
        if not data.keys() <= _PLAIN_MEMBERS:
            _joserfc_check(dict(jwk))
        crv, x, d = data.get("crv"), data.get("x"), data.get("d", None)
        if not isinstance(crv, str) or not isinstance(x, str) or (
                "d" in data and not isinstance(d, str)):
            raise ValueError("crv, x (and d) must be strings")
        if crv != "Ed25519":
            raise ValueError(f"not an Ed25519 key: {crv[:20]!r}")
        seed = None if d is None else _raw32(d)
        try:
            raw_x: bytes | None = _raw32(x)
        except ValueError:
            if seed is None:
                raise
            raw_x = None  # joserfc reads only d of a private key; x is checked by public()
        return cls(data, raw_x, seed)

    @property
    def is_private(self) -> bool:
        return self.seed is not None

    @property
    def x(self) -> bytes:
        """The raw 32-byte public key.

        Raises:
            ValueError: the JWK's ``x`` is not 32 bytes of canonical base64url (a private
                key's ``x`` is checked here, not on import, as joserfc does).
        """
        if self._x is None:
            raise ValueError("x is not a 32-byte Ed25519 public key")
        return self._x

    def public(self) -> Ed25519Key:
        """The public part alone (raises ValueError as :attr:`x` does)."""
        data = {k: v for k, v in self._jwk.items() if k != "d"}
        return Ed25519Key(data, self.x, None)

    def as_dict(self, private: bool = False) -> dict[str, Any]:
        """The JWK (a copy); without ``private`` the ``d`` member is left out.

        Raises:
            ValueError: ``private`` asked of a public key.
        """
        if private and self.seed is None:
            raise ValueError("This key is not a private key.")
        if private:
            return dict(self._jwk)
        return {k: v for k, v in self._jwk.items() if k != "d"}

    def thumbprint(self) -> str:
        """The RFC 7638 SHA-256 thumbprint (base64url) of ``crv``, ``kty`` and ``x``."""
        members = {"crv": self._jwk["crv"], "kty": "OKP", "x": self._jwk["x"]}
        text = json.dumps(members, ensure_ascii=True, separators=(",", ":"))
        return _b64url(hashlib.sha256(text.encode("utf-8")).digest())

    @property
    def private_key(self) -> Any:
        """cryptography's ``Ed25519PrivateKey`` of this key (None for a public key)."""
        if self.seed is None:
            return None
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return Ed25519PrivateKey.from_private_bytes(self.seed)

    @property
    def public_key(self) -> Any:
        """cryptography's ``Ed25519PublicKey`` of ``x``."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        return Ed25519PublicKey.from_public_bytes(self.x)


def _joserfc_check(jwk: dict[str, Any]) -> None:
    from joserfc.errors import JoseError
    from joserfc.jwk import OKPKey

    try:
        OKPKey.import_key(jwk)
    except JoseError as exc:
        raise ValueError(str(exc)) from exc


def public_of(seed: bytes) -> bytes:
    """The raw Ed25519 public key of a 32-byte seed."""
    try:
        from nacl.bindings import crypto_sign_seed_keypair
    except ImportError:  # PyNaCl is optional
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        return Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(
            Encoding.Raw, PublicFormat.Raw)
    return bytes(crypto_sign_seed_keypair(seed)[0])


def ed25519_signer(seed: bytes) -> Callable[[bytes], bytes]:
    """A function signing bytes with the key of the 32-byte ``seed`` (64-byte signature).

    Ed25519 (RFC 8032) is deterministic: the same key and message give the same signature
    in every correct implementation. With PyNaCl installed it is libsodium's
    (``crypto_sign``, about two thirds of cryptography's cost per permit on the bench
    machine); without it, cryptography's. tests/keys/test_signer.py checks both give
    identical bytes.
    """
    try:
        from nacl.bindings import crypto_sign, crypto_sign_seed_keypair
    except ImportError:  # PyNaCl is optional
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return cast(Callable[[bytes], bytes],
                    Ed25519PrivateKey.from_private_bytes(seed).sign)
    _, secret = crypto_sign_seed_keypair(seed)
    try:
        from nacl._sodium import ffi, lib
    except ImportError:  # PyNaCl's own binding module moved: its public wrapper
        def sign(message: bytes) -> bytes:
            return bytes(crypto_sign(message, secret)[:64])

        return sign
    new, crypto_sign_raw, buffer, null = ffi.new, lib.crypto_sign, ffi.buffer, ffi.NULL

    def sign_direct(message: bytes) -> bytes:
        # nacl.bindings.crypto_sign without its wrapper: the same libsodium call into a
        # buffer of signature + message, copying out the 64-byte signature only (not the
        # whole signed message, then a slice of it): ~7,500 fewer instructions a permit.
        signed = new("unsigned char[]", len(message) + 64)
        if crypto_sign_raw(signed, null, message, len(message), secret) != 0:
            raise RuntimeError("Unexpected library error")
        return bytes(buffer(signed, 64))

    return sign_direct


def ed25519_verifier(public: bytes) -> Callable[[bytes, bytes], bool]:
    """``check(signature, message)``: True when ``signature`` is the Ed25519 signature of
    ``message`` under the raw 32-byte public key ``public``.

    With PyNaCl installed the check is libsodium's (``crypto_sign_open``, about half of
    cryptography's cost per redeem on the bench machine), else cryptography's. A signature
    that is not 64 bytes is refused before libsodium sees it (it reads the first 64 bytes
    of signature + message as the signature). libsodium refuses a few encodings OpenSSL
    accepts (small-order ``R``, non-canonical or small-order keys); none of them is a
    signature of an honest key's holder, and tests/keys/test_verify_fast.py checks both
    agree on genuine and altered signatures.
    """
    try:
        from nacl.bindings import crypto_sign_open
        from nacl.exceptions import BadSignatureError
    except ImportError:  # PyNaCl is optional
        return _cryptography_verifier(public)

    def check(signature: bytes, message: bytes) -> bool:
        if len(signature) != 64:
            return False
        try:
            crypto_sign_open(signature + message, public)
        except BadSignatureError:
            return False
        return True

    return check


def _cryptography_verifier(public: bytes) -> Callable[[bytes, bytes], bool]:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    key = Ed25519PublicKey.from_public_bytes(public)

    def check(signature: bytes, message: bytes) -> bool:
        try:
            key.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    return check


def aes256gcm_encrypt(key: bytes, nonce: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """AES-256-GCM: ciphertext followed by the 16-byte tag (``cryptography``'s AESGCM
    layout), with libsodium where it has AES-GCM (PyNaCl ≥ 1.6 on AES-NI/ARMv8), else
    cryptography. ``key`` 32 bytes, ``nonce`` 12 bytes."""
    nacl = _nacl_aead()
    if nacl is not None:
        return bytes(nacl[0](plaintext, aad, nonce, key))
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(key).encrypt(nonce, plaintext, aad)


def aes256gcm_decrypt(key: bytes, nonce: bytes, sealed: bytes, aad: bytes) -> bytes:
    """Inverse of :func:`aes256gcm_encrypt` (``key`` 32 bytes, ``nonce`` 12 bytes).

    Raises:
        ValueError: the tag does not verify (wrong key, nonce, data or ``aad``), or the
            input is shorter than the tag.
    """
    if len(sealed) < 16:
        raise ValueError("sealed data shorter than the tag")
    nacl = _nacl_aead()
    if nacl is not None:
        from nacl.exceptions import CryptoError

        try:
            return bytes(nacl[1](sealed, aad, nonce, key))
        except CryptoError as exc:
            raise ValueError("AES-GCM tag does not verify") from exc
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        return AESGCM(key).decrypt(nonce, sealed, aad)
    except InvalidTag as exc:
        raise ValueError("AES-GCM tag does not verify") from exc


@functools.cache
def _nacl_aead() -> tuple[Callable[..., bytes], Callable[..., bytes]] | None:
    """libsodium's AES-256-GCM (encrypt, decrypt), or None when PyNaCl lacks it (< 1.6,
    absent) or the CPU has no AES instructions (libsodium then refuses it)."""
    try:
        from nacl.bindings import crypto_aead_aes256gcm_decrypt, crypto_aead_aes256gcm_encrypt
        from nacl.exceptions import UnavailableError
    except ImportError:
        return None
    try:
        crypto_aead_aes256gcm_encrypt(b"", None, bytes(12), bytes(32))
    except UnavailableError:
        return None
    return crypto_aead_aes256gcm_encrypt, crypto_aead_aes256gcm_decrypt
