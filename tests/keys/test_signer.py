"""Permit signatures from libsodium (PyNaCl) are byte-identical to cryptography's Ed25519
(issue 20): the keyring may use either, the token is the same."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from cosigner.keys.ed25519 import ed25519_signer
from cosigner.keys.keyring import Keyring

pytest.importorskip("nacl")


@settings(max_examples=200, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), message=st.binary(max_size=2048))
def test_libsodium_signature_is_cryptography_s(seed: bytes, message: bytes) -> None:
    private = Ed25519PrivateKey.from_private_bytes(seed)
    signer = ed25519_signer(seed)
    assert not hasattr(signer, "__self__")  # PyNaCl is installed: libsodium signs
    assert signer(message) == private.sign(message)
    private.public_key().verify(signer(message), message)


@settings(max_examples=200, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), message=st.binary(max_size=2048))
def test_the_direct_libsodium_call_signs_as_pynacl_s_wrapper(seed: bytes,
                                                              message: bytes) -> None:
    from nacl.bindings import crypto_sign, crypto_sign_seed_keypair

    signature = ed25519_signer(seed)(message)
    assert type(signature) is bytes
    assert signature == crypto_sign(message, crypto_sign_seed_keypair(seed)[1])[:64]


@pytest.mark.usefixtures("without_pynacl")
def test_without_pynacl_cryptography_signs() -> None:
    seed = bytes(range(32))
    signer = ed25519_signer(seed)
    assert isinstance(getattr(signer, "__self__", None), Ed25519PrivateKey)
    assert signer(b"m") == Ed25519PrivateKey.from_private_bytes(seed).sign(b"m")


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


def _joserfc_accepts(keyring: Keyring, token: str) -> bool:
    from joserfc import jws
    from joserfc.errors import JoseError
    from joserfc.jwk import OKPKey

    entry = next(iter(keyring._entries.values()))
    key = OKPKey.import_key(entry.verify_key.as_dict())
    try:
        jws.deserialize_compact(token, key, algorithms=["Ed25519"])
    except (JoseError, ValueError, TypeError):
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(position=st.integers(0, 400), char=st.sampled_from("AQgw_-=.xZ09+/ "),
       part=st.sampled_from(["header", "payload", "signature", "anywhere"]))
def test_direct_verification_accepts_what_joserfc_accepts(position: int, char: str,
                                                          part: str) -> None:
    """Ed25519 tokens are verified without joserfc since issue 20: a token, altered one
    character anywhere, is accepted only if joserfc accepts it too (the header checks of
    Keyring.verify run first and may refuse more)."""
    from cosigner.core.errors import PermitRefused

    now = datetime(2030, 1, 1, tzinfo=UTC)
    keyring = _KEYRING
    token = keyring.sign({"iss": "cosigner", "jti": "p-1", "n": 1}, typ="cosigner-permit+jwt")
    segments = token.split(".")
    index = {"header": 0, "payload": 1, "signature": 2}.get(part)
    if index is None:
        at = position % (len(token) + 1)
        altered = token[:at] + char + token[at + 1:]
    else:
        segment = segments[index]
        at = position % (len(segment) + 1)
        segments[index] = segment[:at] + char + segment[at + 1:]
        altered = ".".join(segments)
    try:
        keyring.verify(altered, typ="cosigner-permit+jwt", now=now)
        ours = True
    except PermitRefused:
        ours = False
    if altered == token:
        assert ours and _joserfc_accepts(keyring, token)
    if ours:  # never more than joserfc accepts
        assert _joserfc_accepts(keyring, altered)


_KEYRING = Keyring.ephemeral(now=datetime(2030, 1, 1, tzinfo=UTC))


def test_a_second_spelling_of_the_signature_is_refused() -> None:
    """The last base64url character of a 64-byte signature carries 4 unused bits: setting
    them spells the same bytes differently; the token has one spelling only (the failure CI
    found with hypothesis in session 4)."""
    from cosigner.core.errors import PermitRefused

    token = _KEYRING.sign({"iss": "cosigner", "jti": "p-2"}, typ="cosigner-permit+jwt")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet.index(token[-1])
    assert last % 16 == 0  # canonical: the low 4 bits are zero
    twin = token[:-1] + alphabet[last + 1]
    assert base64_same_bytes(token.rsplit(".", 1)[1], twin.rsplit(".", 1)[1])
    with pytest.raises(PermitRefused) as refused:
        _KEYRING.verify(twin, typ="cosigner-permit+jwt")
    assert refused.value.code == "bad_signature"
    assert not _joserfc_accepts(_KEYRING, twin)


def base64_same_bytes(a: str, b: str) -> bool:
    import base64
    return base64.urlsafe_b64decode(a + "==") == base64.urlsafe_b64decode(b + "==")
