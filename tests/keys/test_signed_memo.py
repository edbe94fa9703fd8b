"""A token this process signed is verified from its memo (cosigner.keys.signed_memo,
issue 20): every answer must be the one libsodium gives.

* a keyring that signed a token and a twin holding the same key but no memo answer the
  same (claims, or refusal code) for the token and for every alteration of it: another
  payload under the same signature, a signature moved from another token, flipped
  characters anywhere;
* a key whose published ``x`` is not the public key of its ``d`` still refuses its own
  tokens (the memo compares public keys);
* the memo itself: exact matches only, bounded, the older generation dropped whole.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cosigner.core.errors import PermitRefused
from cosigner.keys.ed25519 import Ed25519Key
from cosigner.keys.keyring import Keyring
from cosigner.keys.material import KeyInfo
from cosigner.keys.signed_memo import SignedMemo

NOW = datetime(2030, 1, 1, tzinfo=UTC)
TYP = "cosigner-permit+jwt"


def _pair(jwk: dict[str, str] | None = None) -> tuple[Keyring, Keyring]:
    """(a keyring, a twin with the same key and an empty memo)."""
    key = Ed25519Key.import_key(jwk) if jwk else Ed25519Key.generate()
    info = KeyInfo(kid=key.thumbprint(), created_at=NOW - timedelta(seconds=1))
    return tuple(Keyring.from_keys([(key, info)], now=NOW, max_token_lifetime_s=60)
                 for _ in range(2))  # type: ignore[return-value]


def _answer(keyring: Keyring, token: str) -> object:
    try:
        return keyring.verify(token, typ=TYP, now=NOW)
    except PermitRefused as refused:
        return refused.code


_CLAIMS = st.dictionaries(st.sampled_from(["jti", "n", "tool", "é"]),
                          st.integers(-5, 5) | st.text(max_size=6), max_size=4)


@settings(max_examples=200, deadline=None)
@given(first=_CLAIMS, second=_CLAIMS,
       edit=st.sampled_from(["none", "swap_payload", "swap_signature", "flip", "truncate"]),
       position=st.integers(0, 2_000), char=st.sampled_from("Aa0_-.=x"))
def test_the_memo_answers_as_libsodium_s(first: dict[str, object], second: dict[str, object],
                                         edit: str, position: int, char: str) -> None:
    signer, twin = _pair()
    token, other = signer.sign(first, typ=TYP), signer.sign(second, typ=TYP)
    head, payload, signature = token.split(".")
    if edit == "swap_payload":
        token = f"{head}.{other.split('.')[1]}.{signature}"
    elif edit == "swap_signature":
        token = f"{head}.{payload}.{other.split('.')[2]}"
    elif edit == "flip":
        at = position % len(token)
        token = token[:at] + char + token[at + 1:]
    elif edit == "truncate":
        token = token[:position % len(token)]
    answer = _answer(signer, token)
    assert answer == _answer(twin, token)
    if edit == "none":
        assert answer == first


def test_a_token_made_here_is_vouched_for_and_an_altered_one_is_not() -> None:
    signer, _ = _pair()
    token = signer.sign({"n": 1}, typ=TYP)
    head, payload, signature = token.split(".")
    memo = signer._signed  # the keyring's own memo: the shortcut is really taken
    public = next(iter(signer._signers.values()))[1]
    assert memo.vouches(signature, public, f"{head}.{payload}".encode())
    assert not memo.vouches(signature, public, f"{head}.{payload}x".encode())
    assert not memo.vouches(signature, bytes(32), f"{head}.{payload}".encode())
    assert signer.verify(token, typ=TYP, now=NOW) == {"n": 1}


def test_a_key_whose_x_is_not_its_own_still_refuses_its_tokens() -> None:
    """``x`` of another key with this ``d``: the signature cannot verify under ``x``;
    the memo (which compares public keys) must not say otherwise."""
    mine, stranger = Ed25519Key.generate(), Ed25519Key.generate()
    jwk = dict(mine.as_dict(private=True), x=stranger.as_dict()["x"])
    signer, twin = _pair(jwk)
    token = signer.sign({"n": 1}, typ=TYP)
    assert _answer(signer, token) == _answer(twin, token) == "bad_signature"


def test_the_memo_is_bounded_and_forgets_a_whole_generation() -> None:
    memo = SignedMemo(capacity=3)
    for n in range(3):
        memo.remember(f"s{n}", b"k", b"m%d" % n)
    assert len(memo) == 3
    memo.remember("s3", b"k", b"m3")  # the first generation becomes the older one
    assert len(memo) == 4 and memo.vouches("s0", b"k", b"m0")
    for n in range(4, 6):
        memo.remember(f"s{n}", b"k", b"m%d" % n)
    assert len(memo) == 6 and memo.vouches("s0", b"k", b"m0")  # two full generations
    memo.remember("s6", b"k", b"m6")  # the oldest generation goes, whole
    assert len(memo) == 4
    assert not memo.vouches("s0", b"k", b"m0") and not memo.vouches("s2", b"k", b"m2")
    assert memo.vouches("s3", b"k", b"m3") and memo.vouches("s6", b"k", b"m6")
    with pytest.raises(ValueError):
        SignedMemo(capacity=0)


def test_an_attached_object_comes_back_only_for_the_exact_token_and_kind() -> None:
    """``verify_recalled`` answers with what ``sign_parts`` attached for that very token
    (of the asked type), and with the decoded payload for anything else; a twin without
    the memo always decodes."""
    signer, twin = _pair()
    attached = ("claims", 1)
    token = signer.sign_parts({"n": 1}, typ=TYP, attach=attached)[0]
    other = signer.sign_parts({"n": 2}, typ=TYP)[0]
    assert signer.verify_recalled(token, typ=TYP, kind=tuple, now=NOW) is attached
    assert signer.verify_recalled(token, typ=TYP, kind=dict, now=NOW) == {"n": 1}
    assert signer.verify_recalled(other, typ=TYP, kind=tuple, now=NOW) == {"n": 2}
    assert twin.verify_recalled(token, typ=TYP, kind=tuple, now=NOW) == {"n": 1}
    head, _, signature = token.split(".")
    swapped = f"{head}.{other.split('.')[1]}.{signature}"  # its signature, another payload
    for keyring in (signer, twin):
        with pytest.raises(PermitRefused) as refused:
            keyring.verify_recalled(swapped, typ=TYP, kind=tuple, now=NOW)
        assert refused.value.code == "bad_signature"
    with pytest.raises(PermitRefused) as refused:
        signer.verify_recalled(token, typ="other", kind=tuple, now=NOW)
    assert refused.value.code == "wrong_token_type"
    memo = SignedMemo()
    memo.remember("sig", b"k", b"input", attached)
    assert memo.recall("sig", b"k", b"input") == (True, attached)
    assert memo.recall("sig", b"k", b"inpuT") == (False, None)
    assert memo.recall("sig", b"K", b"input") == (False, None)
