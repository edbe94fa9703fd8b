"""A Python-rules-only server leaves its optional heavy libraries unloaded (issue 20:
idle RSS). Each case starts the app (lifespan entered: database, keyring, bundles,
background tasks) in a fresh interpreter, as ``cosigner serve`` does, and reports which
of :data:`OPTIONAL` ended up in ``sys.modules``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, TEST_KEK

#: Loaded only when used: a Rego bundle, an OPA bundle, a Slack call or request, an OIDC
#: sign-in, a passkey route, a webhook delivery, a migration (run in a child), a page, a
#: tool's first argument check (the compiled validator; bundle load checks with jsonschema),
#: cryptography and joserfc (the keyring signs, verifies and unseals on PyNaCl; OIDC loads
#: joserfc on the first sign-in).
OPTIONAL = ("regopy", "opa_client", "aiohttp", "slack_sdk", "authlib", "httpx", "webauthn",
            "alembic", "mako", "jinja2", "jsonschema_rs", "cryptography", "joserfc",
            # the other commands of the command line (``cosigner serve`` parses only its own)
            "cosigner.cli.accounts", "cosigner.cli.audit", "cosigner.cli.demo",
            "cosigner.cli.init", "cosigner.cli.policy", "cosigner.cli.reads")

CHILD = """
import asyncio, json, sys
from pathlib import Path

import cosigner.cli.main  # what `cosigner serve` imports before it builds the app
from cosigner.app import create_app
from cosigner.core.settings import Settings

url, bundles, keys, kek, optional = json.loads(sys.argv[1])
cosigner.cli.main.build_parser(["serve", "--no-migrate"]).parse_args(["serve", "--no-migrate"])

async def main():
    settings = Settings(database_url=url, bundle_dirs=[Path(b) for b in bundles],
                        key_dir=Path(keys), key_encryption_key=kek)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        await asyncio.sleep(0.2)  # background tasks have ticked once
        snapshot = app.state.context.store.snapshot
        assert snapshot.bundles and not snapshot.errors, snapshot.errors
        return sorted(name for name in optional if name in sys.modules)

print(json.dumps(asyncio.run(main())))
"""


def _loaded_at_startup(database_url: str, bundles: list[Path], tmp_path: Path) -> list[str]:
    # asyncpg is PostgreSQL's driver: a server on SQLite never loads it.
    optional = [*OPTIONAL, *(("asyncpg",) if database_url.startswith("sqlite") else ())]
    argument = json.dumps([database_url, [str(b) for b in bundles], str(tmp_path / "keys"),
                           TEST_KEK, optional])
    done = subprocess.run([sys.executable, "-c", CHILD, argument], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_python_rules_only_app_leaves_optional_libraries_unloaded(
        database_url: str, tmp_path: Path) -> None:
    assert _loaded_at_startup(database_url, [ROOT / "policies"], tmp_path) == []


def test_a_rego_bundle_loads_regopy(database_url: str, tmp_path: Path) -> None:
    # The same probe sees a lazily loaded library once something needs it.
    assert _loaded_at_startup(database_url, [ROOT / "policies", ROOT / "rego"],
                              tmp_path) == ["regopy"]
