"""Review probes of the keyring's own crypto (cosigner.keys.ed25519, session 6): a host
without AES instructions (libsodium refuses AES-GCM there) unseals what an AES-NI host
sealed and the reverse; damaged sealed rows are a KeyringError on both backends (never a
TypeError or a crash with another type); JWKs an operator may hand-write are taken or
refused as joserfc took or refused them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from joserfc.errors import JoseError
from joserfc.jwk import OKPKey

from cosigner.keys import ed25519
from cosigner.keys.ed25519 import Ed25519Key
from cosigner.keys.keyring import KeyringError
from cosigner.keys.store import seal, unseal

nacl_bindings = pytest.importorskip("nacl.bindings")


@pytest.fixture
def without_aes_ni(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """libsodium as on a CPU without AES-NI / ARMv8 crypto: AES-GCM unavailable."""
    from nacl.exceptions import UnavailableError

    def unavailable(*_: Any, **__: Any) -> bytes:
        raise UnavailableError("Construction requires hardware acceleration")

    monkeypatch.setattr(nacl_bindings, "crypto_aead_aes256gcm_encrypt", unavailable)
    monkeypatch.setattr(nacl_bindings, "crypto_aead_aes256gcm_decrypt", unavailable)
    ed25519._nacl_aead.cache_clear()
    yield
    ed25519._nacl_aead.cache_clear()


KEK, KID, SEED = bytes(range(32)), "kid-Probe_1", bytes(range(64, 96))


def _damaged(sealed: bytes) -> list[bytes]:
    flipped = bytearray(sealed)
    flipped[-1] ^= 1
    return [b"", sealed[:5], sealed[:12], sealed[:27], sealed[:-1], bytes(flipped),
            sealed + b"\0"]


def test_sealed_on_an_aes_ni_host_opens_without_it(without_aes_ni: None) -> None:
    assert ed25519._nacl_aead() is None
    sealed_here = seal(KEK, KID, SEED)  # cryptography (no AES-NI)
    assert unseal(KEK, KID, sealed_here) == SEED
    for bad in _damaged(sealed_here):
        with pytest.raises(KeyringError):
            unseal(KEK, KID, bad)
    with pytest.raises(KeyringError):
        unseal(KEK, KID + "x", sealed_here)


def test_both_backends_open_each_others_seals_and_refuse_damage_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ed25519._nacl_aead.cache_clear()
    if ed25519._nacl_aead() is None:
        pytest.skip("libsodium has no AES-GCM on this CPU")
    by_sodium = seal(KEK, KID, SEED)
    from nacl.exceptions import UnavailableError

    def unavailable(*_: Any, **__: Any) -> bytes:
        raise UnavailableError("no AES-NI")

    monkeypatch.setattr(nacl_bindings, "crypto_aead_aes256gcm_encrypt", unavailable)
    monkeypatch.setattr(nacl_bindings, "crypto_aead_aes256gcm_decrypt", unavailable)
    ed25519._nacl_aead.cache_clear()
    try:
        by_openssl = seal(KEK, KID, SEED)
        assert unseal(KEK, KID, by_sodium) == SEED
        for bad in _damaged(by_sodium):
            with pytest.raises(KeyringError):
                unseal(KEK, KID, bad)
    finally:
        monkeypatch.undo()
        ed25519._nacl_aead.cache_clear()
    assert ed25519._nacl_aead() is not None
    assert unseal(KEK, KID, by_openssl) == SEED
    for bad in _damaged(by_openssl):
        with pytest.raises(KeyringError):
            unseal(KEK, KID, bad)
    with pytest.raises(KeyringError):
        unseal(KEK, "", by_openssl)  # empty AAD is not the kid's


def _hand_written() -> dict[str, dict[str, Any]]:
    ref = OKPKey.generate_key("Ed25519", private=True, auto_kid=False).as_dict(private=True)
    other = OKPKey.generate_key("Ed25519", private=True, auto_kid=False).as_dict(private=True)
    x, d = ref["x"], ref["d"]
    return {
        "plain": ref, "public": {"kty": "OKP", "crv": "Ed25519", "x": x},
        "x padded": {"kty": "OKP", "crv": "Ed25519", "x": x + "="},
        "x std alphabet": {"kty": "OKP", "crv": "Ed25519",
                           "x": x.replace("-", "+").replace("_", "/")},
        "x with space": {"kty": "OKP", "crv": "Ed25519", "x": x[:9] + " " + x[9:]},
        "x short": {"kty": "OKP", "crv": "Ed25519", "x": x[:-2]},
        "x non-ascii": {"kty": "OKP", "crv": "Ed25519", "x": x[:-1] + "é"},
        "private, x of another key": {**ref, "x": other["x"]},
        "private without x": {"kty": "OKP", "crv": "Ed25519", "d": d},
        "d null": {**ref, "d": None}, "x null": {**ref, "x": None},
        "d short": {**ref, "d": d[:-3]}, "crv missing": {"kty": "OKP", "x": x},
        "with kid/use/alg": {**ref, "kid": "k", "use": "sig", "alg": "Ed25519"},
        "kty int": {**ref, "kty": 1}, "kty missing": {"crv": "Ed25519", "x": x},
    }


@pytest.mark.parametrize("name", list(_hand_written()))
def test_a_hand_written_jwk_is_taken_or_refused_as_joserfc_did(name: str) -> None:
    jwk = _hand_written()[name]
    try:
        theirs: OKPKey | None = OKPKey.import_key(dict(jwk))
    except (JoseError, ValueError, TypeError):
        theirs = None
    try:
        ours: Ed25519Key | None = Ed25519Key.import_key(jwk)
    except ValueError:
        ours = None
    assert (ours is None) == (theirs is None), name
    if ours is not None and theirs is not None:
        assert ours.thumbprint() == theirs.thumbprint()
        assert ours.as_dict() == theirs.as_dict()
        assert ours.is_private == theirs.is_private
