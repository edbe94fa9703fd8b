"""A real OpenID provider for the single sign-on tests: the npm ``oidc-provider`` package
(``provider.mjs``, pinned by ``package-lock.json``; ``npm ci`` on first use), on a free
loopback port, with accounts the tests write to its state file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import STARTUP_S, free_port

HERE = Path(__file__).resolve().parent
ACR_PWD = "urn:cosigner:test:pwd"
ACR_MFA = "urn:cosigner:test:mfa"
OTP = "123456"
CLIENT_ID = "cosigner"
CLIENT_SECRET = "test-client-secret-0123456789"


class TestIdP:
    """The running provider: its issuer URL and the accounts it knows."""

    __test__ = False

    def __init__(self, port: int, state_file: Path) -> None:
        self.port = port
        self.issuer = f"http://127.0.0.1:{port}"
        self.state_file = state_file
        self.accounts: dict[str, dict[str, Any]] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._write()

    def _write(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"accounts": self.accounts}))
        os.replace(tmp, self.state_file)

    def account(self, sub: str, *groups: str, tamper: str | None = None) -> str:
        """Add (or change) an account whose ID tokens carry ``sub`` and ``groups``."""
        self.accounts[sub] = {"groups": list(groups), "otp": OTP, "tamper": tamper}
        self._write()
        return sub

    def start(self, redirect_uris: list[str], log_path: Path) -> None:
        node = shutil.which("node")
        npm = shutil.which("npm")
        if node is None or npm is None:
            pytest.fail("node/npm are missing: run scripts/ensure-test-deps.sh")
        if not (HERE / "node_modules" / "oidc-provider" / "package.json").is_file():
            subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                           cwd=HERE, check=True, timeout=600)
        env = {**os.environ, "PORT": str(self.port), "STATE_FILE": str(self.state_file),
               "CLIENTS": json.dumps([{"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
                                       "redirect_uris": redirect_uris}])}
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([node, str(HERE / "provider.mjs")], env=env,
                                         cwd=HERE, stdout=log, stderr=log)
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("provider exited: " + log_path.read_text()[-2000:])
            try:
                url = self.issuer + "/.well-known/openid-configuration"
                if httpx.get(url, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"provider did not start in {STARTUP_S} s")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def provider_settings(idp: TestIdP, **overrides: Any) -> dict[str, Any]:
    """A tenant's ``COSIGNER_OIDC`` entry for the test provider."""
    return {"issuer": idp.issuer, "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
            "scopes": ["openid", "profile", "groups"], "roles_claim": "groups",
            "role_map": {"finance-approvers": ["finance"], "treasury": ["finance", "treasury"]},
            "label": "Test IdP", "acr_values": [ACR_PWD, ACR_MFA],
            "mfa_acr_values": [ACR_MFA], **overrides}


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestIdP]:
    """A provider not started yet (its issuer is known, so a server can be configured
    first); the module's server fixture starts it with its callback URL."""
    folder = tmp_path_factory.mktemp("idp")
    provider = TestIdP(free_port(), folder / "state.json")
    yield provider
    provider.stop()
