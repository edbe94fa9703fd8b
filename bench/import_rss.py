"""What each import costs in resident memory, in the order ``cosigner serve`` pays it.

One fresh interpreter imports the groups below one after another and prints the VmRSS
growth of each (MB, 2^20 bytes); the last rows are the rest of ``cosigner.app`` (our own
modules and the pydantic models and tables they build) and ``cosigner.cli.main``. Then,
each in its own fresh interpreter, the optional parts that a Python-rules-only server
no longer loads at startup, measured on top of the whole app::

    .venv/bin/python bench/import_rss.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (label, modules), imported in this order: each row is the growth over the rows above.
#: ``cosigner`` is imported first (tiny), so SQLAlchemy's asyncio package and uvicorn load
#: as a server loads them (cosigner.core.lean_imports: no ORM, no uvicorn command line).
SERVED = [
    ("interpreter (site)", []),
    ("fastapi + starlette + pydantic", ["fastapi"]),
    ("uvicorn (Config, Server) + uvloop + httptools", ["uvicorn", "uvicorn.config",
                                                       "uvicorn.server", "uvloop", "httptools"]),
    ("sqlalchemy (core + asyncio engine, no ORM)", ["sqlalchemy", "sqlalchemy.ext.asyncio"]),
    ("aiosqlite + sqlite3", ["aiosqlite"]),
    ("pydantic-settings", ["pydantic_settings"]),
    ("PyNaCl (the keyring: Ed25519, AES-256-GCM)", ["nacl.bindings"]),
    ("orjson + rfc8785", ["orjson", "rfc8785"]),
    ("jsonschema + referencing", ["jsonschema"]),
    ("PyYAML", ["yaml"]),
    ("opentelemetry API", ["opentelemetry.trace"]),
    ("python-multipart", ["python_multipart"]),
    ("the rest of cosigner.app", ["cosigner.app"]),
    ("cosigner.cli.main", ["cosigner.cli.main"]),
]

#: loaded only when used (Rego bundle, OPA bundle, Slack call, sign-in, passkey, webhook,
#: migration, ...): measured alone on top of cosigner.app + cosigner.cli.main.
OPTIONAL = [
    ("regopy (Rego bundle)", ["regopy"]),
    ("opa client + aiohttp (OPA bundle)", ["cosigner.policy.opa_engine"]),
    ("slack_sdk web client + aiohttp (Slack call)", ["cosigner.slack.api", "aiohttp",
                                                      "slack_sdk.web.async_client"]),
    ("httpx + Authlib + joserfc (OIDC sign-in)", ["httpx", "authlib.integrations.httpx_client",
                                                  "joserfc.jwt", "joserfc.jwk"]),
    ("cryptography + joserfc (keyring without PyNaCl, key tests, CLI)",
     ["cryptography.hazmat.primitives.asymmetric.ed25519",
      "cryptography.hazmat.primitives.ciphers.aead", "joserfc.jwk"]),
    ("webauthn (passkey routes)", ["webauthn"]),
    ("jinja2 (first page rendered)", ["jinja2"]),
    ("slack_sdk.signature (first Slack request)", ["slack_sdk.signature"]),
    ("httpx (webhook delivery)", ["httpx"]),
    ("alembic + mako (migration, in a child)", ["cosigner.db.migrate"]),
    ("jsonschema-rs (a tool's first validation)", ["jsonschema_rs"]),
    ("prometheus_client (first series recorded or scrape)", ["prometheus_client"]),
    ("page routes + argon2 + babel (first request under /ui)",
     ["cosigner.web.routes", "cosigner.web.routes_auth", "cosigner.web.routes_oidc",
      "cosigner.web.routes_passkeys", "cosigner.web.routes_slack"]),
    ("sqlalchemy.orm (AsyncSession asked for)", ["sqlalchemy.ext.asyncio.session"]),
    ("SQLAlchemy PostgreSQL dialect (PostgreSQL only)", ["sqlalchemy.dialects.postgresql"]),
    ("uvicorn.main: click + watchfiles (uvicorn.run, --workers)", ["uvicorn.main"]),
    ("uvicorn WebSocket protocol (not served: ws=none)",
     ["uvicorn.protocols.websockets.websockets_sansio_impl"]),
]

PROBE = """
import importlib, sys
import cosigner  # cosigner.core.lean_imports, as in a server
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024
groups = [g.split(',') if g else [] for g in sys.argv[1:]]
last = rss()
for group in groups:
    for name in group:
        importlib.import_module(name)
    now = rss()
    print(f'{now - last:.1f} {now:.1f}')
    last = now
"""


def probe(groups: list[list[str]]) -> list[tuple[float, float]]:
    """(growth, total) MB per group, best of three fresh interpreters."""
    runs = []
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", PROBE, *(",".join(g) for g in groups)],
                              capture_output=True, text=True, cwd=ROOT, check=True)
        runs.append([tuple(map(float, line.split())) for line in done.stdout.splitlines()])
    return [min(column, key=lambda row: row[1]) for column in zip(*runs, strict=True)]


def main() -> None:
    rows = probe([[]] + [modules for _, modules in SERVED])
    base = rows[0][1]
    print("| import (in serving order) | + MB | total MB |\n|---|---:|---:|")
    print(f"| interpreter (site) | | {base:.1f} |")
    for (label, _), (growth, total) in zip(SERVED[1:], rows[2:], strict=True):
        print(f"| {label} | {growth:.1f} | {total:.1f} |")
    app = [name for _, modules in SERVED for name in modules]
    print("\n| loaded only when used | + MB over the app |\n|---|---:|")
    for label, modules in OPTIONAL:
        growth, _ = probe([app, modules])[1]
        print(f"| {label} | {growth:.1f} |")


if __name__ == "__main__":
    main()
