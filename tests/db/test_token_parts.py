"""A permit token stored decoded (forms 2 and 3) from the bytes its minting remembered
(:func:`cosigner.db.compressed.remember_token`) is stored exactly as from the token
decoded (issue 20: the base64url round trip is skipped, the stored bytes are the same)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from cosigner.db import compressed, response_row
from cosigner.keys.keyring import Keyring
from cosigner.permits.tokens import PERMIT_TYP, mint_permit

REFS = ("01a232bb-8747-71dd-9f29-1804dc82d966", "req-1", "sha256:" + "7d" * 32,
        "sha256:" + "df" * 32)


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def answer(token: str) -> dict[str, Any]:
    return {"decision_id": REFS[0], "request_id": REFS[1], "effect": "allow",
            "policy": {"id": "p", "version": "1", "revision": REFS[3]},
            "args_hash": REFS[2], "reasons": [],
            "permit": {"token": token, "jti": "j", "expires_at": "2026-12-02T08:11:42Z"},
            "approval": None}


def forget() -> None:
    compressed._minted.clear()  # noqa: SLF001
    compressed._minted_before.clear()  # noqa: SLF001


def stored_both_ways(value: dict[str, Any], parts: tuple[bytes, bytes, bytes]
                     ) -> tuple[list[Any], list[Any]]:
    """What each storing function gives for ``value`` from its token decoded, and from
    ``parts`` remembered (each takes the remembered parts out: remembered again)."""
    decoded, remembered = [], []
    for store in (compressed.response_parts, compressed.bind_response,
                  lambda value: response_row.bind(value, REFS)):
        forget()
        decoded.append(store(value))
        compressed.remember_token(value["permit"]["token"], *parts)
        remembered.append(store(value))
        assert value["permit"]["token"] not in compressed._minted  # noqa: SLF001 - used once
    forget()
    return decoded, remembered


@settings(max_examples=400, deadline=None)
@given(header=st.binary(max_size=60), claims=st.binary(max_size=300) | st.builds(
    orjson.dumps, st.dictionaries(st.sampled_from(["decision_id", "args_hash", "jti"]),
                                  st.sampled_from(REFS) | st.text(max_size=12))),
       signature=st.binary(max_size=70))
def test_remembered_parts_store_what_decoding_stores(header: bytes, claims: bytes,
                                                     signature: bytes) -> None:
    token = ".".join(b64url(raw) for raw in (header, claims, signature))
    decoded, remembered = stored_both_ways(answer(token), (header, claims, signature))
    assert remembered == decoded
    assert decoded[0] is not None and decoded[0][1:] == (header, claims, signature)


def test_a_minted_permit_is_stored_from_its_remembered_parts() -> None:
    keyring = Keyring.ephemeral(now=datetime(2026, 12, 1, tzinfo=UTC))
    forget()
    token, _ = mint_permit(
        keyring, issuer="i", audience="a", tenant="t", run_id="r", decision_id=REFS[0],
        approval_id=None, tool="x", args_hash=REFS[2],
        policy={"id": "p", "version": "1", "revision": REFS[3]}, approvers=[],
        now=datetime(2026, 12, 1, tzinfo=UTC), ttl_s=60)
    remembered = compressed._minted[token]  # noqa: SLF001
    assert ".".join(b64url(raw) for raw in remembered) == token
    decoded, again = stored_both_ways(answer(token), remembered)
    assert again == decoded


def test_a_token_stored_again_is_decoded_again() -> None:
    forget()
    token = ".".join(b64url(raw) for raw in (b"h", b"c", b"s"))
    compressed.remember_token(token, b"h", b"c", b"s")
    first = compressed.bind_response(answer(token))
    assert token not in compressed._minted  # noqa: SLF001
    assert compressed.bind_response(answer(token)) == first


def test_remembered_tokens_are_bounded() -> None:
    forget()
    for i in range(compressed._MINTED_MAX * 2 + 5):  # noqa: SLF001
        compressed.remember_token(f"t{i}", b"h", b"c", b"s")
    held = len(compressed._minted) + len(compressed._minted_before)  # noqa: SLF001
    assert held <= 2 * compressed._MINTED_MAX  # noqa: SLF001
    assert "t0" not in compressed._minted and "t0" not in compressed._minted_before  # noqa: SLF001
    forget()


def test_sign_parts_spell_the_token() -> None:
    keyring = Keyring.ephemeral(now=datetime(2026, 12, 1, tzinfo=UTC))
    claims = {"jti": "j", "n": 1, "é": "✓"}
    token, header, payload, signature = keyring.sign_parts(claims, typ=PERMIT_TYP)
    assert token == ".".join(b64url(raw) for raw in (header, payload, signature))
    assert keyring.sign(claims, typ=PERMIT_TYP) == token  # Ed25519 is deterministic
    assert orjson.loads(header)["typ"] == PERMIT_TYP and orjson.loads(payload) == claims
    assert keyring.verify(token, typ=PERMIT_TYP) == claims
