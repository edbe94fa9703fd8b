"""Issue 15, gap 9: permits verify offline with the JOSE libraries executors use.

Two live servers, each on its own database (so its own keyring): one with the default
``Ed25519`` keys (RFC 9864), one with ``COSIGNER_SIGNING_ALG=EdDSA`` (RFC 8037) for
libraries that lack the new name. PyJWT knows only ``EdDSA``; joserfc and Node's ``jose``
know both. Each key has one alg, published in the JWKS, and the server redeems the permits
it signed under it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from joserfc import jws
from joserfc.jwk import OKPKey

from cosigner.core.canonical import args_hash
from cosigner.db.migrate import upgrade
from tests.conftest import PG_BASE_URL, ROOT, LiveServer, _pg_admin, start_module_server
from tests.e2e.helpers import make_keys, refund

HERE = Path(__file__).parent / "jose"
ARGS = {"order_id": "ord_8472", "amount_minor": 5000, "currency": "USD",
        "reason_code": "duplicate_charge"}


class Server:
    def __init__(self, live: LiveServer, database_url: str) -> None:
        self.live, self.database_url = live, database_url
        self.tenant = f"t-{uuid.uuid4().hex[:10]}"
        self.key = asyncio.run(make_keys(database_url, self.tenant, {
            "r": (["runtime"], "agent")}))["r"]

    def jwks(self) -> dict[str, Any]:
        return dict(httpx.get(self.live.url + "/.well-known/jwks.json", timeout=30).json())

    def permit(self) -> str:
        resp = httpx.post(self.live.url + "/v1/decisions", json=refund(5000), timeout=30,
                          headers={"Authorization": self.key})
        assert resp.json()["effect"] == "allow", resp.text
        return str(resp.json()["permit"]["token"])

    def redeem(self, token: str) -> httpx.Response:
        return httpx.post(self.live.url + "/v1/permits/redeem", timeout=30, json={
            "permit": token, "tool": "issue_refund", "args": ARGS},
            headers={"Authorization": self.key})


def _own_pg_database() -> tuple[str, str]:
    """A migrated PostgreSQL database of its own (its own keyring): ``(url, name)``."""
    name = f"cosigner_jose_{uuid.uuid4().hex[:8]}"
    _pg_admin(f'CREATE DATABASE "{name}"')
    url = PG_BASE_URL.rsplit("/", 1)[0] + "/" + name
    asyncio.run(upgrade(url))
    return url, name


@pytest.fixture(scope="module")
def servers(db_kind: str, sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, Server]]:
    started: list[LiveServer] = []
    dropped: list[str] = []
    out = {}
    try:
        for alg in ("Ed25519", "EdDSA"):
            pg_url = None
            if db_kind == "postgres":  # the session's database shares one keyring
                pg_url, name = _own_pg_database()
                dropped.append(name)
            live, url = start_module_server(  # SQLite: a fresh copy of the template
                tmp_path_factory.mktemp(f"jose-{alg}"), db_kind=db_kind, pg_url=pg_url,
                sqlite_template=sqlite_template, bundle_dirs=[ROOT / "policies"],
                COSIGNER_SIGNING_ALG=alg)
            started.append(live)
            out[alg] = Server(live, url)
        yield out
    finally:
        for live in started:
            live.stop()
        for name in dropped:
            _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _jwk(server: Server, token: str) -> dict[str, Any]:
    kid = jwt.get_unverified_header(token)["kid"]
    [key] = [k for k in server.jwks()["keys"] if k["kid"] == kid]
    return dict(key)


def test_jwks_names_the_one_alg_of_each_key(servers: dict[str, Server]) -> None:
    for alg, server in servers.items():
        token = server.permit()
        assert jwt.get_unverified_header(token)["alg"] == alg
        assert _jwk(server, token)["alg"] == alg
        assert server.redeem(token).status_code == 200  # the server accepts its own alg


def test_pyjwt_verifies_an_eddsa_permit(servers: dict[str, Server]) -> None:
    server = servers["EdDSA"]
    token = server.permit()
    key = jwt.PyJWK(_jwk(server, token))
    claims = jwt.decode(token, key.key, algorithms=["EdDSA"], audience="cosigner-executor",
                        issuer="cosigner")
    assert claims["args_hash"] == args_hash(ARGS) and claims["tool"] == "issue_refund"


@pytest.mark.parametrize("alg", ["Ed25519", "EdDSA"])
def test_joserfc_verifies_permits(servers: dict[str, Server], alg: str) -> None:
    server = servers[alg]
    token = server.permit()
    key = OKPKey.import_key(_jwk(server, token))
    with warnings.catch_warnings():  # joserfc flags EdDSA as deprecated (RFC 9864)
        warnings.simplefilter("ignore")
        verified = jws.deserialize_compact(token, key, algorithms=[alg])
    assert json.loads(verified.payload)["args_hash"] == args_hash(ARGS)


@pytest.mark.parametrize("alg", ["Ed25519", "EdDSA"])
def test_client_permit_verifier_follows_the_jwks(servers: dict[str, Server], alg: str) -> None:
    from cosigner_client.jwks import PermitVerifier

    server = servers[alg]
    token = server.permit()
    claims = PermitVerifier(server.jwks()).verify(token, tool="issue_refund", args=ARGS)
    assert claims["args_hash"] == args_hash(ARGS)


def _node_jose(jwks: dict[str, Any], token: str, alg: str) -> dict[str, Any]:
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.fail("node/npm missing: run scripts/ensure-test-deps.sh (installs Node.js)")
    if not (HERE / "node_modules" / "jose").is_dir():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=HERE,
                       check=True, timeout=300)
    run = subprocess.run([node, "verify.mjs"], cwd=HERE, capture_output=True, text=True,
                         input=json.dumps({"jwks": jwks, "token": token, "alg": alg}),
                         timeout=60, check=True)
    return dict(json.loads(run.stdout))


@pytest.mark.parametrize("alg", ["Ed25519", "EdDSA"])
def test_node_jose_verifies_permits(servers: dict[str, Server], alg: str) -> None:
    server = servers[alg]
    token = server.permit()
    verified = _node_jose(server.jwks(), token, alg)
    assert verified["ok"] and verified["alg"] == alg, verified
    assert verified["claims"]["args_hash"] == args_hash(ARGS)
    other = "EdDSA" if alg == "Ed25519" else "Ed25519"
    assert not _node_jose(server.jwks(), token, other)["ok"]  # the JWKS pins the alg


def test_K17_client_permit_verifier_pins_the_jwks_alg_per_key() -> None:
    import base64
    from datetime import UTC, datetime

    from cosigner_client.errors import ServerRefused
    from cosigner_client.jwks import PermitVerifier
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from cosigner.keys.keyring import Keyring

    now = datetime.now(UTC)
    keyring = Keyring.ephemeral(now=now, alg="EdDSA")
    claims = {"iss": "cosigner", "aud": "cosigner-executor", "exp": int(now.timestamp()) + 60,
              "nbf": int(now.timestamp()) - 1, "tool": "issue_refund",
              "args_hash": args_hash(ARGS)}
    verifier = PermitVerifier(keyring.jwks(now=now))
    token = keyring.sign(claims, typ="cosigner-permit+jwt")
    assert verifier.verify(token, tool="issue_refund", args=ARGS)["tool"] == "issue_refund"

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header = {"alg": "Ed25519", "kid": keyring.current_kid, "typ": "cosigner-permit+jwt"}
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    private = keyring._signing_key.private_key
    assert isinstance(private, Ed25519PrivateKey)
    renamed = f"{signing_input}.{b64(private.sign(signing_input.encode()))}"
    with pytest.raises(ServerRefused) as refused:
        verifier.verify(renamed, tool="issue_refund", args=ARGS)
    assert refused.value.code == "bad_signature"
