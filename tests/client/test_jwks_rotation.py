"""A long-lived offline permit verifier survives ``cosigner keys rotate`` on the live
server's database: an unknown ``kid`` refetches the JWKS (rate-limited), so permits
signed with the new key verify without rebuilding the verifier."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.client.conftest import ACTORS, REFUND, Live
from tests.conftest import ROOT, TEST_KEK

pytest.importorskip("joserfc")

ALLOWED = {**REFUND, "amount_minor": 5000}


def kid_of(token: str) -> str:
    header = token.split(".")[0]
    return str(json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))["kid"])


def rotate(database_url: str) -> str:
    env = {**os.environ, "COSIGNER_DATABASE_URL": database_url,
           "COSIGNER_KEY_ENCRYPTION_KEY": TEST_KEK, "COSIGNER_LOG_LEVEL": "warning"}
    done = subprocess.run([sys.executable, "-m", "cosigner.cli.main", "keys", "rotate"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_verifier_refetches_the_jwks_on_an_unknown_kid(
        live: Live, shared_server: tuple[str, str]) -> None:
    from cosigner_client import Gate
    from cosigner_client.jwks import PermitVerifier

    clock = [1000.0]
    verifier = PermitVerifier.from_server(live.url, refetch_interval=30.0,
                                          clock=lambda: clock[0])
    assert verifier.fetches == 1
    with Gate(live.url, live.runtime, run="run-jwks", **ACTORS) as gate:
        first = gate.decide("issue_refund", ALLOWED, request_id="jwks-1")
        assert first.permit is not None
        old_kid = kid_of(first.permit.token)
        assert old_kid in verifier.kids
        assert verifier.verify(first.permit.token, tool="issue_refund",
                               args=ALLOWED)["tool"] == "issue_refund"

        new_kid = rotate(shared_server[1])
        assert new_kid != old_kid and new_kid not in verifier.kids
        deadline, token, n = time.monotonic() + 30, first.permit.token, 2
        while kid_of(token) != new_kid and time.monotonic() < deadline:
            time.sleep(0.5)  # the server signs with the new key 2 s after the rotation
            decision = gate.decide("issue_refund", ALLOWED, request_id=f"jwks-{n}")
            assert decision.permit is not None
            token, n = decision.permit.token, n + 1
        assert kid_of(token) == new_kid

    clock[0] += 31  # (the verifier's clock: the rotation took longer than its interval)
    claims = verifier.verify(token, tool="issue_refund", args=ALLOWED)  # refetched once
    assert claims["args_hash"] and verifier.fetches == 2 and new_kid in verifier.kids
    assert old_kid in verifier.kids  # old keys stay published while their permits live

    # Rate limit: a bogus kid right after a fetch does not make the verifier ask again...
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    header["kid"] = "no-such-kid"
    bogus = base64.urlsafe_b64encode(json.dumps(header).encode()).decode().rstrip("=")
    forged = ".".join([bogus, *token.split(".")[1:]])
    from cosigner_client import ServerRefused

    for _ in range(3):
        with pytest.raises(ServerRefused) as info:
            verifier.verify(forged, tool="issue_refund", args=ALLOWED)
        assert info.value.code == "unknown_kid"
    assert verifier.fetches == 2
    # ...until the interval has passed.
    clock[0] += 31
    with pytest.raises(ServerRefused):
        verifier.verify(forged, tool="issue_refund", args=ALLOWED)
    assert verifier.fetches == 3
    assert httpx.get(f"{live.url}/.well-known/jwks.json").status_code == 200
