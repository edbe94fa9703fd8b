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
#: joserfc on the first sign-in); SQLAlchemy's ORM (cosigner.core.lean_imports), the page routes
#: with argon2 and babel (the first request under /ui), prometheus-client (the first series
#: recorded or scrape), uvicorn's command line and reload supervisor (click, watchfiles)
#: and its WebSocket protocol (serve runs ``uvicorn.Server`` with ``ws="none"``).
OPTIONAL = ("regopy", "opa_client", "aiohttp", "slack_sdk", "authlib", "httpx", "webauthn",
            "alembic", "mako", "jinja2", "jsonschema_rs", "cryptography", "joserfc",
            "sqlalchemy.orm", "argon2", "babel.numbers", "prometheus_client",
            "cosigner.web.routes", "cosigner.web.routes_auth", "cosigner.identity.accounts",
            "uvicorn.main", "click", "watchfiles", "websockets",
            # the other commands of the command line (``cosigner serve`` parses only its own)
            "cosigner.cli.accounts", "cosigner.cli.audit", "cosigner.cli.demo",
            "cosigner.cli.init", "cosigner.cli.policy", "cosigner.cli.reads")

CHILD = """
import asyncio, json, sys
from pathlib import Path

import cosigner.cli.main  # what `cosigner serve` imports before it builds the app
import uvicorn  # as `cosigner serve` imports it (after cosigner: cosigner.core.lean_imports)
from cosigner.app import create_app
from cosigner.core.settings import Settings

url, bundles, keys, kek, optional = json.loads(sys.argv[1])
cosigner.cli.main.build_parser(["serve", "--no-migrate"]).parse_args(["serve", "--no-migrate"])

async def main():
    settings = Settings(database_url=url, bundle_dirs=[Path(b) for b in bundles],
                        key_dir=Path(keys), key_encryption_key=kek)
    app = create_app(settings)
    uvicorn.Config(app, **cosigner.cli.main.uvicorn_options("127.0.0.1", 0, settings)).load()
    async with app.router.lifespan_context(app):
        await asyncio.sleep(0.2)  # background tasks have ticked once
        snapshot = app.state.context.store.snapshot
        assert snapshot.bundles and not snapshot.errors, snapshot.errors
        return sorted(name for name in optional if name in sys.modules)

print(json.dumps(asyncio.run(main())))
"""


def _loaded_at_startup(database_url: str, bundles: list[Path], tmp_path: Path) -> list[str]:
    # asyncpg and SQLAlchemy's PostgreSQL dialect: a server on SQLite never loads them.
    optional = [*OPTIONAL, *(("asyncpg", "sqlalchemy.dialects.postgresql")
                             if database_url.startswith("sqlite") else ())]
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


#: In a fresh interpreter: the public names of a package imported as Cosigner imports it
#: (lean), before and after a name only the real ``__init__`` binds; ``real`` imports it
#: without Cosigner. Prints JSON.
LEAN_CHILD = """
import json, sys
package, late, heavy, lean = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "lean"
if lean:
    import cosigner  # installs cosigner.core.lean_imports
import importlib
module = importlib.import_module(package)
before = heavy in sys.modules
value = getattr(module, late)
print(json.dumps({"before": before, "after": heavy in sys.modules,
                  "names": sorted(n for n in vars(module) if not n.startswith("_")),
                  "late": f"{value.__module__}.{value.__qualname__}"
                          if hasattr(value, "__qualname__") else repr(value)}))
"""


def _package_as_seen(package: str, late: str, heavy: str, lean: bool) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", LEAN_CHILD, package, late, heavy,
                           "lean" if lean else "real"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_lean_packages_become_the_real_ones_on_first_other_name() -> None:
    # (package, a name only its real __init__ binds, the module that name pulls in)
    for package, late, heavy in (("sqlalchemy.ext.asyncio", "AsyncSession", "sqlalchemy.orm"),
                                 ("uvicorn", "run", "uvicorn.main"),
                                 ("uvicorn", "__version__", "click")):
        lean = _package_as_seen(package, late, heavy, lean=True)
        real = _package_as_seen(package, late, heavy, lean=False)
        assert (lean["before"], lean["after"]) == (False, True), package
        assert real["before"] is True
        assert lean["names"] == real["names"], package
        assert lean["late"] == real["late"], package


PAGES_CHILD = """
import asyncio, json, sys
import httpx
import cosigner.cli.main
from cosigner.app import create_app
from cosigner.core.settings import Settings

async def main():
    url, keys, kek = sys.argv[1:4]
    app = create_app(Settings(database_url=url, key_dir=keys, key_encryption_key=kek))
    seen = ["cosigner.web.routes" in sys.modules]
    path = str(app.url_path_for("login_form"))  # a page's URL before any page was served
    seen.append("cosigner.web.routes" in sys.modules)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            first = await client.get("/ui/login")
            again = await client.get("/ui/login")
            missing = await client.get("/ui/no-such-page")
    print(json.dumps({"seen": seen, "path": path, "first": first.status_code,
                      "again": again.status_code, "form": "password" in first.text,
                      "missing": missing.status_code,
                      "headers": first.headers.get("x-frame-options")}))
asyncio.run(main())
"""


def test_first_request_under_ui_includes_the_pages(database_url: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", PAGES_CHILD, database_url,
                           str(tmp_path / "keys"), TEST_KEK], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["seen"] == [False, True]  # url_path_for includes them too
    assert seen["path"] == "/ui/login"
    assert (seen["first"], seen["again"], seen["form"]) == (200, 200, True)
    assert seen["missing"] == 404
    assert seen["headers"]  # the security headers (installed at startup) are on the page
