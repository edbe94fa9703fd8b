"""The keyring's own Ed25519 JWK and AES-256-GCM (issue 20: no cryptography/joserfc in the
serving process) answer exactly what joserfc's ``OKPKey`` and cryptography's ``AESGCM``
answer: the same JWK members and thumbprint, the same keys accepted and refused, the same
sealed bytes, with and without PyNaCl."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st
from joserfc.errors import JoseError
from joserfc.jwk import OKPKey

from cosigner.keys.ed25519 import Ed25519Key, aes256gcm_decrypt, aes256gcm_encrypt
from cosigner.keys.folder import read_key_file
from cosigner.keys.keyring import Keyring

pytest.importorskip("nacl")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _theirs(jwk: dict[str, Any]) -> OKPKey | None:
    try:
        return OKPKey.import_key(dict(jwk))
    except (JoseError, ValueError, TypeError):
        return None


def _ours(jwk: dict[str, Any]) -> Ed25519Key | None:
    try:
        return Ed25519Key.import_key(jwk)
    except ValueError:
        return None


@settings(max_examples=200, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32))
def test_a_key_has_joserfc_s_members_and_thumbprint(seed: bytes) -> None:
    reference = OKPKey.import_key(
        __import__("cryptography.hazmat.primitives.asymmetric.ed25519", fromlist=["x"])
        .Ed25519PrivateKey.from_private_bytes(seed))
    ours = Ed25519Key.import_key(reference.as_dict(private=True))
    assert ours.as_dict(private=True) == reference.as_dict(private=True)
    assert list(ours.as_dict()) == list(reference.as_dict())
    assert ours.as_dict() == reference.as_dict()
    assert ours.thumbprint() == reference.thumbprint()
    assert ours.seed == seed and ours.is_private
    assert ours.public().as_dict() == reference.as_dict() and not ours.public().is_private
    with pytest.raises(ValueError, match="not a private key"):
        ours.public().as_dict(private=True)


def test_a_generated_key_is_laid_out_as_joserfc_s() -> None:
    ours = Ed25519Key.generate()
    reference = OKPKey.generate_key("Ed25519", private=True, auto_kid=False)
    assert list(ours.as_dict(private=True)) == list(reference.as_dict(private=True))
    # x is the public key of d (joserfc derives it with cryptography)
    assert OKPKey.import_key({"kty": "OKP", "crv": "Ed25519",
                              "d": ours.as_dict(private=True)["d"],
                              "x": "unused"}).public_key.public_bytes_raw() == ours.x
    assert OKPKey.import_key(ours.as_dict(private=True)).thumbprint() == ours.thumbprint()


_GOOD = {"kty": "OKP", "crv": "Ed25519", "x": _b64(bytes(range(32))),
         "d": _b64(bytes(range(32, 64)))}
_MEMBER_VALUES = st.one_of(
    st.sampled_from([_GOOD["x"], _GOOD["d"], _GOOD["x"] + "=", _GOOD["x"][:-1],
                     _GOOD["x"][:-1] + "B", _GOOD["x"] + "AA", "+" + _GOOD["x"][1:],
                     _GOOD["x"][:-1] + "/", "Ed25519", "Ed448", "X25519", "OKP", "EC", "",
                     "sig", "enc", "kid-1"]),
    st.text(alphabet="AQgw_-+/=Bé ", max_size=45), st.none(), st.integers(0, 3),
    st.lists(st.sampled_from(["sign", "verify", "encrypt"]), max_size=2))


@settings(max_examples=600, deadline=None)
@given(changes=st.dictionaries(
    st.sampled_from(["kty", "crv", "x", "d", "kid", "use", "key_ops", "alg"]),
    _MEMBER_VALUES | st.just(None), max_size=4),
    drop=st.sets(st.sampled_from(["crv", "x", "d", "kty"])))
def test_import_accepts_and_refuses_what_joserfc_does(changes: dict[str, Any],
                                                      drop: set[str]) -> None:
    jwk = {**_GOOD, **changes}
    for name in drop:
        jwk.pop(name, None)
    jwk = {k: v for k, v in jwk.items() if not (k in changes and changes[k] is None
                                                 and k in ("kid", "use", "key_ops", "alg"))}
    if jwk.get("kty") not in ("OKP", None, 0) or jwk.get("crv") not in ("Ed25519", None):
        return  # the key folder and the store refuse other key types before importing
    theirs, ours = _theirs(jwk), _ours(jwk)
    assert (ours is None) == (theirs is None), jwk
    if ours is not None and theirs is not None:
        assert ours.as_dict(private=ours.is_private) == theirs.as_dict(
            private=theirs.is_private)
        assert ours.thumbprint() == theirs.thumbprint()
        public = _theirs(theirs.as_dict())  # what make_entry builds the verifier from
        try:
            assert ours.public().as_dict() == (public.as_dict() if public else None)
        except ValueError:
            assert public is None


@settings(max_examples=200, deadline=None)
@given(key=st.binary(min_size=32, max_size=32), nonce=st.binary(min_size=12, max_size=12),
       plaintext=st.binary(max_size=100), aad=st.binary(min_size=1, max_size=60))
def test_sealing_is_cryptography_s_aes_gcm(key: bytes, nonce: bytes, plaintext: bytes,
                                           aad: bytes) -> None:
    sealed = aes256gcm_encrypt(key, nonce, plaintext, aad)
    assert sealed == AESGCM(key).encrypt(nonce, plaintext, aad)
    assert aes256gcm_decrypt(key, nonce, sealed, aad) == plaintext
    for altered in (sealed[:-1] + bytes([sealed[-1] ^ 1]), sealed[1:], sealed[:15]):
        with pytest.raises(ValueError):
            aes256gcm_decrypt(key, nonce, altered, aad)
        with pytest.raises((InvalidTag, ValueError)):
            AESGCM(key).decrypt(nonce, altered, aad)
    with pytest.raises(ValueError):
        aes256gcm_decrypt(key, nonce, sealed, aad + b"x")


@pytest.mark.usefixtures("without_pynacl")
def test_without_pynacl_keys_and_sealing_use_cryptography() -> None:
    key = Ed25519Key.generate()
    reference = OKPKey.import_key(key.as_dict(private=True))
    assert reference.public_key.public_bytes_raw() == key.x
    sealed = aes256gcm_encrypt(bytes(32), bytes(12), b"seed", b"kid")
    assert sealed == AESGCM(bytes(32)).encrypt(bytes(12), b"seed", b"kid")
    assert aes256gcm_decrypt(bytes(32), bytes(12), sealed, b"kid") == b"seed"
    with pytest.raises(ValueError):
        aes256gcm_decrypt(bytes(31) + b"\1", bytes(12), sealed, b"kid")


def test_a_key_file_written_with_joserfc_is_read_and_signs_the_same(tmp_path: Path) -> None:
    """Key folders written by earlier versions (joserfc's JWK) load unchanged."""
    from joserfc import jws

    reference = OKPKey.generate_key("Ed25519", private=True, auto_kid=False)
    kid = reference.thumbprint()
    path = tmp_path / f"{kid}.json"
    path.write_text(json.dumps({"format": 1, "kid": kid,
                                "created_at": "2030-01-01T00:00:00+00:00",
                                "retired_at": None, "not_after": None,
                                "jwk": reference.as_dict(private=True)}))
    path.chmod(0o600)
    key, info = read_key_file(path)
    assert info.kid == kid and key.as_dict(private=True) == reference.as_dict(private=True)
    from datetime import UTC, datetime

    now = datetime(2030, 1, 2, tzinfo=UTC)
    keyring = Keyring.from_keys([(key, info)], now=now, max_token_lifetime_s=60)
    token = keyring.sign({"n": 1}, typ="t")
    header, payload, _ = token.split(".")
    expected = jws.serialize_compact(
        json.loads(base64.urlsafe_b64decode(header + "==")),
        base64.urlsafe_b64decode(payload + "=="), reference, algorithms=["Ed25519"])
    assert token == expected


def test_keys_sealed_by_earlier_versions_unseal_and_new_seals_open_with_cryptography() -> None:
    """Rows sealed with cryptography's AESGCM (every earlier version) open unchanged, and
    what is sealed now opens with cryptography (a replica without PyNaCl)."""
    from cosigner.keys.store import seal, unseal

    kek, kid, raw = bytes(range(32)), "kid-1", bytes(range(100, 132))
    nonce = bytes(12)
    assert unseal(kek, kid, nonce + AESGCM(kek).encrypt(nonce, raw, kid.encode())) == raw
    sealed = seal(kek, kid, raw)
    assert AESGCM(kek).decrypt(sealed[:12], sealed[12:], kid.encode()) == raw


def _signed_token(jwk: dict[str, Any]) -> str:
    from datetime import UTC, datetime, timedelta

    from cosigner.keys.material import KeyInfo

    now = datetime(2030, 1, 1, tzinfo=UTC)
    key = Ed25519Key.import_key(jwk)
    info = KeyInfo(kid=key.thumbprint(), created_at=now - timedelta(seconds=1))
    keyring = Keyring.from_keys([(key, info)], now=now, max_token_lifetime_s=60)
    token = keyring.sign({"n": 1, "text": "é"}, typ="t")
    assert keyring.verify(token, typ="t", now=now)["n"] == 1
    return token


@pytest.fixture
def nacl_token() -> tuple[dict[str, Any], str]:
    jwk = Ed25519Key.generate().as_dict(private=True)
    return jwk, _signed_token(jwk)


def test_without_pynacl_the_keyring_signs_the_same_token(
        nacl_token: tuple[dict[str, Any], str], without_pynacl: None) -> None:
    """``nacl_token`` is made first (argument order), with PyNaCl."""
    jwk, token = nacl_token
    with pytest.raises(ImportError):
        import nacl.bindings  # noqa: F401
    assert _signed_token(jwk) == token
