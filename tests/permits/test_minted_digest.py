"""Redeem vouched for by the permit row's token digest (issue 20, migration 0025).

A permit's row keeps 128 bits of SHA-256 of the minted token. A redeem presenting that
exact text, whose signature this process's memo no longer holds (minted long ago, or by
another replica), skips libsodium's Ed25519 check (the row is read before the signature
check: on SQLite's raw driver, or through the SQLAlchemy path on PostgreSQL); any other
text — another signature, a changed payload, a row minted before the migration — is
checked as before and refused with the same code. The libsodium calls are counted by
wrapping each key's ``check``.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import select, update

from cosigner.db.tables import permits
from cosigner.keys.keyring import MAX_TOKEN_CHARS
from cosigner.keys.signed_memo import SignedMemo
from cosigner.permits.tokens import stated_claims, token_digest
from tests.conftest import Harness, decision_request
from tests.http.approval_helpers import decide, redeem, refund_args


def _count_checks(h: Harness) -> dict[str, int]:
    """From now on: how many Ed25519 checks (libsodium) the app's keyring runs; and the
    memo of signatures this process made is forgotten (as for an old permit)."""
    keyring = h.context.keyring
    seen = {"checks": 0}

    def counted(check: Callable[[bytes, bytes], bool]) -> Callable[[bytes, bytes], bool]:
        def run(signature: bytes, message: bytes) -> bool:
            seen["checks"] += 1
            return check(signature, message)
        return run

    keyring._entries = {  # noqa: SLF001 - instrumenting the one call under test
        kid: dataclasses.replace(entry, check=counted(entry.check))
        for kid, entry in keyring._entries.items()  # noqa: SLF001
        if entry.check is not None}
    keyring._signed = SignedMemo()  # noqa: SLF001
    return seen


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _payload(token: str) -> dict[str, Any]:
    segment = token.split(".")[1]
    padded = segment + "=" * (-len(segment) % 4)
    loaded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(padded))
    return loaded


async def _minted(h: Harness, tenant: str) -> tuple[dict[str, str], str]:
    runtime = await h.headers(tenant, "runtime")
    decision = await decide(h, runtime, decision_request(args=refund_args(5000)))
    assert decision["effect"] == "allow"
    return runtime, str(decision["permit"]["token"])


async def test_the_minted_token_needs_no_signature_check(harness: Harness,
                                                         tenant: str) -> None:
    runtime, token = await _minted(harness, tenant)
    async with harness.db.read() as conn:
        stored = (await conn.execute(select(permits.c.token_digest).where(
            permits.c.jti == _payload(token)["jti"]))).scalar_one()
    assert stored == token_digest(token) and len(stored) == 16
    seen = _count_checks(harness)
    resp = await redeem(harness, runtime, token, "issue_refund", refund_args(5000))
    assert resp.status_code == 200, resp.text
    assert seen["checks"] == 0
    again = await redeem(harness, runtime, token, "issue_refund", refund_args(5000))
    assert again.status_code == 409 and again.json()["code"] == "already_redeemed"


async def test_another_signature_for_the_permit_is_checked_and_refused(
        harness: Harness, tenant: str) -> None:
    runtime, token = await _minted(harness, tenant)
    header, payload, signature = token.split(".")
    raw = bytearray(base64.urlsafe_b64decode(signature + "=="))
    raw[0] ^= 1
    forged = f"{header}.{payload}.{_b64(bytes(raw))}"
    seen = _count_checks(harness)
    resp = await redeem(harness, runtime, forged, "issue_refund", refund_args(5000))
    assert resp.json()["code"] == "bad_signature", resp.text
    assert seen["checks"] == 1
    # The permit itself is untouched: the minted token still redeems.
    ok = await redeem(harness, runtime, token, "issue_refund", refund_args(5000))
    assert ok.status_code == 200, ok.text


async def test_a_changed_payload_under_the_minted_signature_is_refused(
        harness: Harness, tenant: str) -> None:
    runtime, token = await _minted(harness, tenant)
    header, payload, signature = token.split(".")
    claims = _payload(token)
    claims["exp"] += 3600  # the same permit (jti, decision), a longer life
    changed = f"{header}.{_b64(json.dumps(claims, separators=(',', ':')).encode())}.{signature}"
    seen = _count_checks(harness)
    resp = await redeem(harness, runtime, changed, "issue_refund", refund_args(5000))
    assert resp.json()["code"] == "bad_signature", resp.text
    assert seen["checks"] == 1


async def test_a_malformed_payload_with_a_bad_signature_is_still_bad_signature(
        harness: Harness, tenant: str) -> None:
    """The order of the checks is kept: the signature before the payload's JSON."""
    runtime, token = await _minted(harness, tenant)
    header, _, signature = token.split(".")
    broken = f"{header}.{_b64(b'{not json')}.{signature}"
    seen = _count_checks(harness)
    resp = await redeem(harness, runtime, broken, "issue_refund", refund_args(5000))
    assert resp.json()["code"] == "bad_signature", resp.text
    assert seen["checks"] == 1


async def test_a_row_minted_before_the_digest_is_checked_as_before(
        harness: Harness, tenant: str) -> None:
    runtime, token = await _minted(harness, tenant)
    async with harness.db.transaction() as conn:
        await conn.execute(update(permits).where(permits.c.jti == _payload(token)["jti"])
                           .values(token_digest=None))
    seen = _count_checks(harness)
    resp = await redeem(harness, runtime, token, "issue_refund", refund_args(5000))
    assert resp.status_code == 200, resp.text
    assert seen["checks"] == 1


async def test_a_wrong_digest_in_the_row_means_a_signature_check(
        harness: Harness, tenant: str) -> None:
    """A digest that does not match (e.g. a row written by other code) vouches for
    nothing: the token is checked by libsodium and, being genuine, redeems."""
    runtime, token = await _minted(harness, tenant)
    async with harness.db.transaction() as conn:
        await conn.execute(update(permits).where(permits.c.jti == _payload(token)["jti"])
                           .values(token_digest=b"\x00" * 16))
    seen = _count_checks(harness)
    resp = await redeem(harness, runtime, token, "issue_refund", refund_args(5000))
    assert resp.status_code == 200, resp.text
    assert seen["checks"] == 1


async def test_another_tenants_minted_token_is_refused_as_before(
        harness: Harness, tenant: str) -> None:
    """The digest is read only in the caller's tenant: another tenant's genuine token is
    checked by libsodium and refused ``tenant_mismatch``."""
    _, token = await _minted(harness, tenant)
    other = await harness.headers(tenant + "-other", "runtime")
    seen = _count_checks(harness)
    resp = await redeem(harness, other, token, "issue_refund", refund_args(5000))
    assert resp.json()["code"] == "tenant_mismatch", resp.text
    assert seen["checks"] == 1


def test_stated_claims_are_the_payloads_unverified() -> None:
    """What the row is looked up by: the payload's claims, or ``None`` without a read."""
    from cosigner.keys.keyring import Keyring
    from tests.permits.test_tokens import T, mint

    token, claims = mint(Keyring.ephemeral(now=T))
    assert stated_claims(token) == claims
    header, payload, signature = token.split(".")
    assert stated_claims(f"{header}.{payload}.{'A' * 86}") == claims  # not verified
    assert stated_claims(f"{header}.{payload}") is None
    assert stated_claims(f"{header}.{_b64(b'[1]')}.{signature}") is None
    assert stated_claims(f"{header}.{payload}.{signature}" + "A" * MAX_TOKEN_CHARS) is None
