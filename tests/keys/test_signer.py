"""Permit signatures from libsodium (PyNaCl) are byte-identical to cryptography's Ed25519
(issue 20): the keyring may use either, the token is the same."""

from __future__ import annotations

import builtins
from datetime import UTC, datetime
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from cosigner.keys.keyring import Keyring
from cosigner.keys.material import ed25519_signer

pytest.importorskip("nacl")


@settings(max_examples=200, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), message=st.binary(max_size=2048))
def test_libsodium_signature_is_cryptography_s(seed: bytes, message: bytes) -> None:
    private = Ed25519PrivateKey.from_private_bytes(seed)
    signer = ed25519_signer(private)
    assert signer is not private.sign  # PyNaCl is installed: libsodium signs
    assert signer(message) == private.sign(message)
    private.public_key().verify(signer(message), message)


def test_without_pynacl_cryptography_signs(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_nacl(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("nacl"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_nacl)
    private = Ed25519PrivateKey.generate()
    assert ed25519_signer(private) == private.sign


def test_keyring_tokens_verify_and_match_cryptography() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    keyring = Keyring.ephemeral(now=now)
    claims = {"iss": "cosigner", "n": 1, "text": "é"}
    token = keyring.sign(claims, typ="cosigner-permit+jwt")
    assert keyring.verify(token, typ="cosigner-permit+jwt", now=now)["n"] == 1
    signing_input, _, _ = token.rpartition(".")
    private = keyring._signing_key.private_key
    import base64
    expected = base64.urlsafe_b64encode(private.sign(signing_input.encode())).rstrip(b"=")
    assert token.rsplit(".", 1)[1].encode() == expected
