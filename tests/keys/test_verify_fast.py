"""The redeem path's token check takes shortcuts (issue 20, session 5); each must answer
exactly what the reference answers:

* the Ed25519 check through libsodium (``crypto_sign_open``) against cryptography's
  ``Ed25519PublicKey.verify``, on genuine and altered signatures and messages;
* a JOSE segment's JSON through orjson (``cosigner.core.fastjson``, when it proves the
  value) against the stdlib parser with duplicate members refused, accept/reject and
  value;
* a remembered header segment: the same refusal codes and claims as a fresh keyring's.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cosigner.core.errors import PermitRefused
from cosigner.keys import keyring as keyring_module
from cosigner.keys.ed25519 import ed25519_verifier
from cosigner.keys.keyring import Keyring, _decode_json_segment, _reject_duplicates

pytest.importorskip("nacl")


def _raw(private: Ed25519PrivateKey) -> bytes:
    return private.public_key().public_bytes_raw()


def _reference_check(private: Ed25519PrivateKey, signature: bytes, message: bytes) -> bool:
    try:
        private.public_key().verify(signature, message)
    except InvalidSignature:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), message=st.binary(max_size=600),
       edit=st.sampled_from(["none", "flip", "set", "truncate", "extend", "message",
                             "other_key"]),
       position=st.integers(0, 700), value=st.integers(0, 255))
def test_libsodium_check_is_cryptography_s(seed: bytes, message: bytes, edit: str,
                                           position: int, value: int) -> None:
    private = Ed25519PrivateKey.from_private_bytes(seed)
    check = ed25519_verifier(_raw(private))
    signature = private.sign(message)
    if edit == "flip":
        at = position % 64
        signature = signature[:at] + bytes([signature[at] ^ (1 << (value % 8))]) + \
            signature[at + 1:]
    elif edit == "set":
        at = position % 64
        signature = signature[:at] + bytes([value]) + signature[at + 1:]
    elif edit == "truncate":
        signature = signature[:position % 64]
    elif edit == "extend":
        signature = signature + bytes([value]) * (1 + position % 8)
    elif edit == "message":
        at = position % (len(message) + 1)
        message = message[:at] + bytes([value]) + message[at:]
    elif edit == "other_key":
        signature = Ed25519PrivateKey.from_private_bytes(
            bytes([value]) * 32).sign(message)
    assert check(signature, message) is _reference_check(private, signature, message)


def test_a_short_signature_is_never_read_from_the_message() -> None:
    """libsodium reads signature + message as one buffer: 63 signature bytes and a
    message starting with the 64th must not pass."""
    private = Ed25519PrivateKey.generate()
    message = b"x" * 100
    signature = private.sign(message)
    check = ed25519_verifier(_raw(private))
    assert check(signature, message)
    assert not check(signature[:63], signature[63:] + message)


@pytest.mark.usefixtures("without_pynacl")
def test_without_pynacl_cryptography_checks() -> None:
    private = Ed25519PrivateKey.generate()
    check = ed25519_verifier(_raw(private))
    assert check(private.sign(b"m"), b"m")
    assert not check(private.sign(b"m"), b"n")
    assert not check(b"\0" * 64, b"m")


# --- JSON segments -------------------------------------------------------------------------

_SCALARS = (st.none() | st.booleans() | st.integers(-2**60, 2**60)
            | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
_VALUES = st.recursive(
    _SCALARS, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4), max_leaves=12)


def _spellings(value: Any) -> st.SearchStrategy[bytes]:
    """Ways to write ``value`` (and near misses): compact/spaced, ASCII-escaped or raw
    UTF-8, with a member repeated, with NaN or a huge number, with a BOM, truncated."""
    def write(options: tuple[bool, bool, str]) -> bytes:
        ascii_only, spaced, twist = options
        text = json.dumps(value, ensure_ascii=ascii_only,
                          separators=(", ", ": ") if spaced else (",", ":"))
        raw = text.encode("utf-8", "surrogatepass")
        if twist == "duplicate" and raw.startswith(b"{") and len(raw) > 2:
            first = raw[1:].split(b",")[0].rstrip(b"}")
            raw = b"{" + first + b"," + raw[1:]
        elif twist == "nan" and raw.startswith(b"{"):
            raw = b'{"n":NaN,' + raw[1:] if len(raw) > 2 else b'{"n":NaN}'
        elif twist == "huge" and raw.startswith(b"{"):
            raw = b'{"n":123456789012345678901234567890,' + raw[1:] if len(raw) > 2 \
                else b'{"n":1e400}'
        elif twist == "bom":
            raw = b"\xef\xbb\xbf" + raw
        elif twist == "truncated":
            raw = raw[:-1]
        elif twist == "colon_in_key" and raw.startswith(b"{"):
            raw = b'{"a:b":1,"a:b":2,' + raw[1:] if len(raw) > 2 else b'{"a:b":1}'
        return raw

    return st.tuples(st.booleans(), st.booleans(), st.sampled_from(
        ["none", "duplicate", "nan", "huge", "bom", "truncated", "colon_in_key"])).map(write)


def _reference_segment(raw: bytes) -> tuple[str, Any]:
    """What the keyring's parser answered before the orjson path: the stdlib parser with
    duplicates refused, a JSON object only."""
    try:
        value = json.loads(raw, object_pairs_hook=_reject_duplicates)
    except ValueError:
        return "refused", None
    if not isinstance(value, dict):
        return "refused", None
    return "ok", value


def _typed(value: Any) -> Any:
    """``value`` with every number tagged by its type (1, 1.0 and True compare equal)."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, float) and value != value:
        return ("nan",)
    return (type(value).__name__, value)


@settings(max_examples=500, deadline=None)
@given(data=st.data(), value=_VALUES)
@example(data=None, value={"a": 1, "b": "x:y"})
def test_segment_json_is_the_stdlib_parser_s(data: Any, value: Any) -> None:
    raw = data.draw(_spellings(value)) if data is not None else json.dumps(value).encode()
    segment = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    expected, reference = _reference_segment(raw)
    try:
        got = _decode_json_segment(segment, what="payload")
        outcome = "ok"
    except PermitRefused as exc:
        assert exc.code == "malformed_permit"
        got, outcome = None, "refused"
    assert outcome == expected, raw
    if outcome == "ok":
        assert _typed(got) == _typed(reference)


@pytest.mark.parametrize("raw", [b'{"a":1,"a":2}', b'{"a:":1,"a:":2}', b'{"x":"\\u0041","x":1}',
                                 b'{"n":NaN}', b'{"n":9007199254740993}', b'{"f":1e400}',
                                 b"\xef\xbb\xbf{}", b'{"s":"\xed\xa0\x80"}', b"[1]"])
def test_segment_edge_cases(raw: bytes) -> None:
    segment = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    expected, reference = _reference_segment(raw)
    try:
        got: Any = _decode_json_segment(segment, what="payload")
        outcome = "ok"
    except PermitRefused:
        got, outcome = None, "refused"
    assert outcome == expected
    if outcome == "ok":
        assert _typed(got) == _typed(reference)


def test_a_remembered_header_answers_as_a_fresh_one() -> None:
    """Tokens of one key share their header segment, decoded once; a keyring that does
    not hold the kid, or checks another typ, still refuses with its own code."""
    now = datetime(2030, 1, 1, tzinfo=UTC)
    first, other = Keyring.ephemeral(now=now), Keyring.ephemeral(now=now)
    keyring_module._HEADERS.clear()
    token = first.sign({"n": 1}, typ="cosigner-permit+jwt")
    assert first.verify(token, typ="cosigner-permit+jwt", now=now) == {"n": 1}
    assert token.split(".")[0] in keyring_module._HEADERS
    assert first.verify(first.sign({"n": 2}, typ="cosigner-permit+jwt"),
                        typ="cosigner-permit+jwt", now=now) == {"n": 2}
    for keyring, typ, code in ((other, "cosigner-permit+jwt", "unknown_kid"),
                               (first, "other+jwt", "wrong_token_type")):
        with pytest.raises(PermitRefused) as refused:
            keyring.verify(token, typ=typ, now=now)
        assert refused.value.code == code
    # a header that fails to decode is not remembered
    bad = "e30x." + token.split(".", 1)[1]
    with pytest.raises(PermitRefused):
        first.verify(bad, typ="cosigner-permit+jwt", now=now)
    assert "e30x" not in keyring_module._HEADERS


# --- base64url -------------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200),
       text=st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
                    max_size=90))
def test_base64url_is_the_base64_module_s(data: bytes, text: str) -> None:
    """The keyring's base64url helpers (binascii directly) answer as ``base64`` did:
    the same encoding, and on any text of the URL-safe alphabet the same bytes or the
    same refusal (too short a last group, a non-canonical last character)."""
    assert keyring_module._b64url(data) == base64.urlsafe_b64encode(data).rstrip(b"=")
    try:
        reference: bytes | None = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        if base64.urlsafe_b64encode(reference).rstrip(b"=") != text.encode():
            reference = None
    except binascii.Error:
        reference = None
    try:
        got: bytes | None = keyring_module._b64url_decode(text)
    except binascii.Error:
        got = None
    assert got == reference
    for segment in (keyring_module._b64url(data).decode(),):
        assert keyring_module._b64url_decode(segment) == data
