"""Keyring: sign/verify, JWKS, rotation, storage, and forged tokens (cases K10, K17).

Forged tokens are built by hand (base64url + hmac / cryptography), never with the JOSE library
under test.
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import hmac
import io
import json
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from cosigner.core.errors import PermitRefused
from cosigner.keys.ed25519 import Ed25519Key
from cosigner.keys.keyring import Keyring, KeyringError

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
LIFETIME_S = 600
TYP = "cosigner-test+jwt"


# --- hand-made JWS ----------------------------------------------------------------------


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def segment(value: Any) -> str:
    return b64url(json.dumps(value, separators=(",", ":")).encode())


def ed25519_token(private: Ed25519PrivateKey, header: dict[str, Any], claims: Any) -> str:
    signing_input = f"{segment(header)}.{segment(claims)}"
    return f"{signing_input}.{b64url(private.sign(signing_input.encode()))}"


def hs256_token(secret: bytes, header: dict[str, Any], claims: Any) -> str:
    signing_input = f"{segment(header)}.{segment(claims)}"
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(mac)}"


def private_key_from_disk(key_dir: Path, kid: str) -> Ed25519PrivateKey:
    jwk = json.loads((key_dir / f"{kid}.json").read_text())["jwk"]
    return Ed25519PrivateKey.from_private_bytes(b64url_decode(jwk["d"]))


def refused_code(keyring: Keyring, token: str, *, typ: str = TYP) -> str:
    with pytest.raises(PermitRefused) as caught:
        keyring.verify(token, typ=typ)
    return caught.value.code


def make_keyring(tmp_path: Path) -> tuple[Keyring, Ed25519PrivateKey, Path]:
    key_dir = tmp_path / "keys"
    keyring = Keyring.load_or_create(key_dir, now=T0, max_token_lifetime_s=LIFETIME_S)
    return keyring, private_key_from_disk(key_dir, keyring.current_kid), key_dir


def header_for(keyring: Keyring, **overrides: Any) -> dict[str, Any]:
    return {"alg": "Ed25519", "kid": keyring.current_kid, "typ": TYP, **overrides}


# --- round trip, JWKS, rotation ---------------------------------------------------------


def test_sign_verify_round_trip() -> None:
    keyring = Keyring.ephemeral(now=T0)
    claims = {"sub": "x", "n": 1, "nested": {"a": [1, 2]}, "é": "ü"}

    token = keyring.sign(claims, typ=TYP)

    header_b64, payload_b64, _ = token.split(".")
    assert json.loads(b64url_decode(header_b64)) == {
        "alg": "Ed25519",
        "kid": keyring.current_kid,
        "typ": TYP,
    }
    assert b" " not in b64url_decode(payload_b64)
    assert keyring.verify(token, typ=TYP) == claims


def test_sign_gives_the_bytes_of_the_jose_library_and_follows_rotation() -> None:
    """sign() composes the compact JWS itself (hot path); Ed25519 is deterministic, so
    joserfc's serialize_compact over the same header and payload must match byte for
    byte, before and after a rotation (the header cache is per kid)."""
    from joserfc import jws
    from joserfc.jwk import OKPKey

    keyring = Keyring.ephemeral(now=T0)
    claims = {"sub": "x", "n": 1, "é": "ü"}
    for _ in range(2):
        kid = keyring.current_kid
        expected = jws.serialize_compact(
            {"alg": "Ed25519", "kid": kid, "typ": TYP},
            json.dumps(claims, separators=(",", ":"), ensure_ascii=False).encode(),
            OKPKey.import_key(keyring._signing_key.as_dict(private=True)),
            algorithms=["Ed25519"])
        token = keyring.sign(claims, typ=TYP)
        assert token == expected
        assert json.loads(b64url_decode(token.split(".")[0]))["kid"] == kid
        keyring.rotate(now=T0)
    assert keyring.current_kid != kid


def test_signature_verifies_with_the_published_key_alone() -> None:
    keyring = Keyring.ephemeral(now=T0)
    token = keyring.sign({"a": 1}, typ=TYP)

    (jwk,) = keyring.jwks(now=T0)["keys"]
    public = Ed25519PublicKey.from_public_bytes(b64url_decode(jwk["x"]))
    header_b64, payload_b64, signature_b64 = token.split(".")
    public.verify(b64url_decode(signature_b64), f"{header_b64}.{payload_b64}".encode())


def test_jwks_shape() -> None:
    keyring = Keyring.ephemeral(now=T0)

    jwks = keyring.jwks(now=T0)

    assert list(jwks) == ["keys"]
    (jwk,) = jwks["keys"]
    assert set(jwk) == {"kty", "crv", "x", "kid", "alg", "use"}
    assert jwk["kty"] == "OKP"
    assert jwk["crv"] == "Ed25519"
    assert jwk["alg"] == "Ed25519"
    assert jwk["use"] == "sig"
    assert jwk["kid"] == keyring.current_kid
    assert len(b64url_decode(jwk["x"])) == 32


def test_kid_is_the_rfc7638_thumbprint() -> None:
    keyring = Keyring.ephemeral(now=T0)
    (jwk,) = keyring.jwks(now=T0)["keys"]

    members = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": jwk["x"]}, separators=(",", ":"))

    assert keyring.current_kid == b64url(hashlib.sha256(members.encode()).digest())


def test_rotation_keeps_old_key_published_until_not_after() -> None:
    keyring = Keyring.ephemeral(now=T0, max_token_lifetime_s=LIFETIME_S)
    old_kid = keyring.current_kid
    old_token = keyring.sign({"v": "old"}, typ=TYP)
    rotated_at = T0 + timedelta(seconds=100)

    new_kid = keyring.rotate(now=rotated_at)

    assert new_kid != old_kid
    assert keyring.current_kid == new_kid
    old_info = next(info for info in keyring.keys() if info.kid == old_kid)
    assert old_info.retired_at == rotated_at
    assert old_info.not_after == rotated_at + timedelta(seconds=LIFETIME_S)
    new_token = keyring.sign({"v": "new"}, typ=TYP)
    assert json.loads(b64url_decode(new_token.split(".")[0]))["kid"] == new_kid

    just_before = old_info.not_after - timedelta(microseconds=1)
    assert {k["kid"] for k in keyring.jwks(now=just_before)["keys"]} == {old_kid, new_kid}
    assert keyring.verify(old_token, typ=TYP, now=just_before) == {"v": "old"}

    assert [k["kid"] for k in keyring.jwks(now=old_info.not_after)["keys"]] == [new_kid]
    with pytest.raises(PermitRefused) as caught:
        keyring.verify(old_token, typ=TYP, now=old_info.not_after)
    assert caught.value.code == "unknown_kid"
    assert keyring.verify(new_token, typ=TYP, now=old_info.not_after) == {"v": "new"}


# --- storage ----------------------------------------------------------------------------


def test_key_files_are_private_and_reload_gives_same_kids(tmp_path: Path) -> None:
    keyring, _, key_dir = make_keyring(tmp_path)
    token = keyring.sign({"a": 1}, typ=TYP)

    assert stat.S_IMODE(key_dir.stat().st_mode) == 0o700
    files = list(key_dir.glob("*.json"))
    assert [f.name for f in files] == [f"{keyring.current_kid}.json"]
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert not list(key_dir.glob("*.tmp"))

    reloaded = Keyring.load_or_create(key_dir, now=T0, max_token_lifetime_s=LIFETIME_S)

    assert reloaded.current_kid == keyring.current_kid
    assert reloaded.jwks(now=T0) == keyring.jwks(now=T0)
    assert reloaded.verify(token, typ=TYP) == {"a": 1}


def test_rotation_is_persisted_and_retired_file_drops_private_part(tmp_path: Path) -> None:
    keyring, _, key_dir = make_keyring(tmp_path)
    old_kid = keyring.current_kid
    old_token = keyring.sign({"a": 1}, typ=TYP)
    rotated_at = T0 + timedelta(seconds=10)

    new_kid = keyring.rotate(now=rotated_at)

    old_file = json.loads((key_dir / f"{old_kid}.json").read_text())
    assert "d" not in old_file["jwk"]
    assert old_file["retired_at"] is not None
    assert "d" in json.loads((key_dir / f"{new_kid}.json").read_text())["jwk"]
    for path in key_dir.glob("*.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600

    reloaded = Keyring.load_or_create(key_dir, now=rotated_at, max_token_lifetime_s=LIFETIME_S)
    assert reloaded.current_kid == new_kid
    assert {info.kid for info in reloaded.keys()} == {old_kid, new_kid}
    assert reloaded.verify(old_token, typ=TYP) == {"a": 1}

    past = rotated_at + timedelta(seconds=LIFETIME_S)
    pruned = Keyring.load_or_create(key_dir, now=past, max_token_lifetime_s=LIFETIME_S)
    assert [info.kid for info in pruned.keys()] == [new_kid]
    assert not (key_dir / f"{old_kid}.json").exists()
    assert refused_code(pruned, old_token) == "unknown_kid"


def test_interrupted_rotation_resolves_to_newest_key(tmp_path: Path) -> None:
    keyring, _, key_dir = make_keyring(tmp_path)
    first_kid = keyring.current_kid
    # Simulate a crash after the new key was written but before the old one was retired.
    other_dir = tmp_path / "other"
    later = T0 + timedelta(seconds=5)
    other = Keyring.load_or_create(other_dir, now=later, max_token_lifetime_s=LIFETIME_S)
    (other_dir / f"{other.current_kid}.json").rename(key_dir / f"{other.current_kid}.json")

    reloaded = Keyring.load_or_create(key_dir, now=later, max_token_lifetime_s=LIFETIME_S)

    assert reloaded.current_kid == other.current_kid
    first = next(info for info in reloaded.keys() if info.kid == first_kid)
    assert first.retired_at == later
    assert "d" not in json.loads((key_dir / f"{first_kid}.json").read_text())["jwk"]


def _foreign_x() -> str:
    """The JWK ``x`` of another, fresh Ed25519 key."""
    return b64url(Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def test_key_file_whose_kid_does_not_match_its_key_is_refused(tmp_path: Path) -> None:
    keyring, _, key_dir = make_keyring(tmp_path)
    path = key_dir / f"{keyring.current_kid}.json"
    document = json.loads(path.read_text())
    document["jwk"]["x"] = _foreign_x()
    path.write_text(json.dumps(document))

    with pytest.raises(KeyringError):
        Keyring.load_or_create(key_dir, now=T0, max_token_lifetime_s=LIFETIME_S)


# --- malformed tokens -------------------------------------------------------------------


@pytest.mark.parametrize(
    "token",
    [
        "",
        "abc",
        "a.b",
        "a.b.c.d",
        "!!!.e30.AAAA",
        "e30=.e30.AAAA",
        f"{b64url(b'not json')}.e30.AAAA",
        f"{b64url(b'[1]')}.e30.AAAA",
        "x" * 20_000,
    ],
    ids=[
        "empty",
        "one-part",
        "two-parts",
        "four-parts",
        "bad-chars",
        "padding",
        "header-not-json",
        "header-not-object",
        "oversized",
    ],
)
def test_malformed_token_refused(token: str) -> None:
    assert refused_code(Keyring.ephemeral(now=T0), token) == "malformed_permit"


def test_duplicate_header_member_refused(tmp_path: Path) -> None:
    keyring, private, _ = make_keyring(tmp_path)
    header_json = (
        f'{{"alg":"Ed25519","alg":"none","kid":"{keyring.current_kid}","typ":"{TYP}"}}'
    ).encode()
    signing_input = f"{b64url(header_json)}.{segment({'a': 1})}"
    token = f"{signing_input}.{b64url(private.sign(signing_input.encode()))}"

    assert refused_code(keyring, token) == "malformed_permit"


@pytest.mark.parametrize(
    "extra",
    [{"crit": ["b64"], "b64": False}, {"jku": "https://evil.example/jwks"}, {"jwk": {}}],
    ids=["b64-false", "jku", "embedded-jwk"],
)
def test_unexpected_header_members_refused(tmp_path: Path, extra: dict[str, Any]) -> None:
    keyring, private, _ = make_keyring(tmp_path)
    token = ed25519_token(private, header_for(keyring, **extra), {"a": 1})

    assert refused_code(keyring, token) == "malformed_permit"


def test_wrong_typ_refused() -> None:
    keyring = Keyring.ephemeral(now=T0)
    token = keyring.sign({"a": 1}, typ="cosigner-checkpoint+jwt")

    assert refused_code(keyring, token, typ=TYP) == "wrong_token_type"


def test_payload_not_an_object_refused(tmp_path: Path) -> None:
    keyring, private, _ = make_keyring(tmp_path)
    token = ed25519_token(private, header_for(keyring), [1, 2])

    assert refused_code(keyring, token) == "malformed_permit"


def test_hand_signed_token_with_the_real_key_verifies(tmp_path: Path) -> None:
    """Sanity check for the forging helpers used below."""
    keyring, private, _ = make_keyring(tmp_path)

    assert keyring.verify(ed25519_token(private, header_for(keyring), {"a": 1}), typ=TYP) == {
        "a": 1
    }


# --- K17: algorithm confusion -----------------------------------------------------------


def public_key_encodings(keyring: Keyring) -> dict[str, bytes]:
    (jwk,) = keyring.jwks(now=T0)["keys"]
    raw = b64url_decode(jwk["x"])
    public = Ed25519PublicKey.from_public_bytes(raw)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    return {
        "pem": public.public_bytes(serialization.Encoding.PEM, spki),
        "der": public.public_bytes(serialization.Encoding.DER, spki),
        "jwk": json.dumps(jwk).encode(),
        "jwk-compact": json.dumps(jwk, separators=(",", ":")).encode(),
        "raw": raw,
        "x-text": jwk["x"].encode(),
    }


@pytest.mark.parametrize("encoding", ["pem", "der", "jwk", "jwk-compact", "raw", "x-text"])
def test_k17_hs256_keyed_with_public_key_refused(encoding: str) -> None:
    keyring = Keyring.ephemeral(now=T0)
    secret = public_key_encodings(keyring)[encoding]
    token = hs256_token(secret, header_for(keyring, alg="HS256"), {"a": 1})

    assert refused_code(keyring, token) == "bad_signature"


@pytest.mark.parametrize("alg", ["none", "None", "NONE", "nOnE"])
def test_k17_alg_none_refused(alg: str) -> None:
    keyring = Keyring.ephemeral(now=T0)
    token = f"{segment(header_for(keyring, alg=alg))}.{segment({'a': 1})}."

    assert refused_code(keyring, token) == "bad_signature"


@pytest.mark.parametrize("alg", ["EdDSA", "ed25519", "ED25519", "Ed448", "ES256", "", None, 1])
def test_k17_other_alg_refused_even_with_a_valid_signature(tmp_path: Path, alg: Any) -> None:
    keyring, private, _ = make_keyring(tmp_path)
    token = ed25519_token(private, header_for(keyring, alg=alg), {"a": 1})

    assert refused_code(keyring, token) == "bad_signature"


def test_k17_missing_alg_refused(tmp_path: Path) -> None:
    keyring, private, _ = make_keyring(tmp_path)
    header = header_for(keyring)
    del header["alg"]

    assert refused_code(keyring, ed25519_token(private, header, {"a": 1})) == "bad_signature"


def test_k17_unknown_kid_refused(tmp_path: Path) -> None:
    keyring, private, _ = make_keyring(tmp_path)
    token = ed25519_token(private, header_for(keyring, kid="no-such-key"), {"a": 1})

    assert refused_code(keyring, token) == "unknown_kid"


@pytest.mark.parametrize("kid", [None, 1, ["x"], {"kid": "x"}])
def test_k17_non_string_kid_refused(tmp_path: Path, kid: Any) -> None:
    keyring, private, _ = make_keyring(tmp_path)
    token = ed25519_token(private, header_for(keyring, kid=kid), {"a": 1})

    assert refused_code(keyring, token) == "malformed_permit"


@pytest.mark.parametrize("kid", ["../../dev/null", "/dev/null", "../keys/x.json", "."])
def test_k17_path_kid_refused_without_touching_the_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kid: str
) -> None:
    keyring, private, _ = make_keyring(tmp_path)
    token = ed25519_token(private, header_for(keyring, kid=kid), {"a": 1})

    def no_io(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"filesystem touched: {args!r}")

    with monkeypatch.context() as patch:
        for module, name in [
            (builtins, "open"),
            (io, "open"),
            (os, "open"),
            (os, "stat"),
            (os, "lstat"),
            (os, "listdir"),
            (os, "scandir"),
        ]:
            patch.setattr(module, name, no_io)
        with pytest.raises(PermitRefused) as caught:
            keyring.verify(token, typ=TYP)

    assert caught.value.code == "unknown_kid"


# --- K10: forged signatures -------------------------------------------------------------


def test_k10_token_signed_by_another_key_with_the_same_kid_refused() -> None:
    keyring = Keyring.ephemeral(now=T0)
    attacker = Ed25519PrivateKey.generate()
    token = ed25519_token(attacker, header_for(keyring), {"a": 1})

    assert refused_code(keyring, token) == "bad_signature"


def test_k10_token_of_another_keyring_refused() -> None:
    keyring = Keyring.ephemeral(now=T0)
    other = Keyring.ephemeral(now=T0)

    assert refused_code(keyring, other.sign({"a": 1}, typ=TYP)) == "unknown_kid"


def test_k10_payload_edited_with_original_signature_refused() -> None:
    keyring = Keyring.ephemeral(now=T0)
    header_b64, _, signature_b64 = keyring.sign({"role": "viewer"}, typ=TYP).split(".")
    edited = f"{header_b64}.{segment({'role': 'admin'})}.{signature_b64}"

    assert refused_code(keyring, edited) == "bad_signature"


def test_k10_truncated_or_empty_signature_refused() -> None:
    keyring = Keyring.ephemeral(now=T0)
    header_b64, payload_b64, signature_b64 = keyring.sign({"a": 1}, typ=TYP).split(".")

    for signature in ["", signature_b64[:-4], "A" * 86]:
        token = f"{header_b64}.{payload_b64}.{signature}"
        assert refused_code(keyring, token) == "bad_signature"


# --- K17: one alg per key (issue 15, gap 9: EdDSA for PyJWT-style executors) ----------


@pytest.mark.parametrize(("own", "other"), [("Ed25519", "EdDSA"), ("EdDSA", "Ed25519")])
def test_K17_a_key_accepts_only_its_own_alg(own: str, other: str) -> None:
    keyring = Keyring.ephemeral(now=T0, max_token_lifetime_s=LIFETIME_S, alg=own)
    [jwk] = keyring.jwks(now=T0)["keys"]
    assert jwk["alg"] == own
    token = keyring.sign({"sub": "x"}, typ=TYP)
    assert json.loads(b64url_decode(token.split(".")[0]))["alg"] == own
    assert keyring.verify(token, typ=TYP) == {"sub": "x"}
    # The same key, the same signature scheme, the other name: refused.
    private = keyring._signing_key.private_key
    assert isinstance(private, Ed25519PrivateKey)
    renamed = ed25519_token(private, header_for(keyring, alg=other), {"sub": "x"})
    assert refused_code(keyring, renamed) == "bad_signature"
    # A broken signature under the key's own name is refused too.
    head, body, sig = token.split(".")
    forged = f"{head}.{segment({'sub': 'y'})}.{sig}"
    assert refused_code(keyring, forged) == "bad_signature"


def test_K17_eddsa_key_rotation_keeps_its_alg() -> None:
    keyring = Keyring.ephemeral(now=T0, max_token_lifetime_s=LIFETIME_S, alg="EdDSA")
    keyring.rotate(now=T0 + timedelta(seconds=1))
    assert {k["alg"] for k in keyring.jwks(now=T0 + timedelta(seconds=1))["keys"]} == {"EdDSA"}


def test_signing_key_whose_x_is_not_the_public_key_of_its_d_is_refused(
        tmp_path: Path) -> None:
    # A consistent file (kid = thumbprint of x, named by it) whose d belongs to another
    # key: every permit would fail verification, so loading refuses it at startup.
    keyring, _, key_dir = make_keyring(tmp_path)
    path = key_dir / f"{keyring.current_kid}.json"
    document = json.loads(path.read_text())
    document["jwk"]["x"] = _foreign_x()
    document["kid"] = Ed25519Key.import_key(document["jwk"]).thumbprint()
    path.unlink()
    (key_dir / f"{document['kid']}.json").write_text(json.dumps(document))

    with pytest.raises(KeyringError, match="not the public key of d"):
        Keyring.load_or_create(key_dir, now=T0, max_token_lifetime_s=LIFETIME_S)
