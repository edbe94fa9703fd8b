"""Session 13 probes: what a vouch for the token (the permit row's digest) may skip.

Even a ``minted`` that vouches for every token skips only the Ed25519 check: the header's
checks (kid published at ``now``, alg pinned to the key, typ) and the claims' (issuer,
audience, expiry, not-before) run, with their codes, before and after it as without it.
"""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from pathlib import Path

import pytest

from cosigner.core.errors import PermitRefused
from cosigner.keys.signed_memo import SignedMemo
from cosigner.permits.tokens import verify_permit_token
from tests.permits.test_tokens import AUDIENCE, ISSUER, T, make_keyring, mint


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _header(token: str) -> dict[str, str]:
    segment = token.split(".")[0]
    loaded: dict[str, str] = json.loads(base64.urlsafe_b64decode(segment + "=="))
    return loaded




@pytest.mark.parametrize("case", ["retired", "typ", "alg", "expired", "issuer"])
def test_s13_a_vouch_skips_the_signature_and_nothing_else(tmp_path: Path, case: str
                                                          ) -> None:
    keyring, _ = make_keyring(tmp_path)
    token, _ = mint(keyring)
    keyring._signed = SignedMemo()  # noqa: SLF001 - as in another process: no memo
    header, payload, signature = token.split(".")
    now = T
    issuer = ISSUER
    if case == "retired":  # rotated, and past its publication: no longer known
        keyring.rotate(now=T)
        now = T + timedelta(seconds=keyring.max_token_lifetime_s)
    elif case in ("typ", "alg"):
        changed = dict(_header(token), **({"typ": "JWT"} if case == "typ" else
                                          {"alg": "EdDSA"}))
        header = _b64(json.dumps(changed, separators=(",", ":")).encode())
    elif case == "expired":
        now = T + timedelta(days=1)
    else:
        issuer = "https://other.test"
    token = f"{header}.{payload}.{signature}"
    expected = {"retired": "unknown_kid", "typ": "wrong_token_type", "alg": "bad_signature",
                "expired": "expired", "issuer": "bad_signature"}[case]
    for vouch in (False, True):
        kwargs = {"minted": (lambda _: True)} if vouch else {}
        with pytest.raises(PermitRefused) as refused:
            verify_permit_token(keyring, token, now=now, issuer=issuer, audience=AUDIENCE,
                                **kwargs)
        assert refused.value.code == expected, (vouch, refused.value)
