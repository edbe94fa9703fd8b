"""Fixtures for client tests: a live ``cosigner serve`` with keys for one tenant."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from cosigner.core.clock import system_clock
from cosigner.db.database import Database
from cosigner.identity.principals import create_api_key
from tests.client.netfaults import FaultProxy
from tests.conftest import ROOT, start_module_server

ACTORS = {"principal": {"id": "customer-42", "type": "customer"},
          "initiator": {"id": "agent-support", "type": "agent"}}
REFUND = {"order_id": "ord_8472", "amount_minor": 200000, "currency": "USD",
          "reason_code": "duplicate_charge"}


@dataclass
class Live:
    url: str
    tenant: str
    runtime: str
    finance: str
    auditor: str

    def review(self, approval_id: str, decision: str = "approved") -> httpx.Response:
        return httpx.post(f"{self.url}/v1/approvals/{approval_id}/reviews",
                          headers={"Authorization": f"Bearer {self.finance}"},
                          json={"decision": decision, "comment": "checked the ledger"},
                          timeout=10)


def make_keys(database_url: str, tenant: str) -> dict[str, str]:
    async def run() -> dict[str, str]:
        db = Database(database_url)
        try:
            keys = {}
            for name, roles in (("runtime", ["runtime"]), ("finance", ["finance"]),
                                ("auditor", ["auditor"])):
                keys[name], _ = await create_api_key(db, tenant=tenant, roles=roles,
                                                     subject=f"{name}-1", clock=system_clock)
            return keys
        finally:
            await db.dispose()

    return asyncio.run(run())


@pytest.fixture
def live_factory(live_server_factory: Callable[..., Any], database_url: str,
                 tenant: str) -> Callable[..., Live]:
    def make(**env: str) -> Live:
        server = live_server_factory(**env)
        return Live(url=server.url, tenant=tenant, **make_keys(database_url, tenant))
    return make


@pytest.fixture(scope="module")
def shared_server(db_kind: str, pg_url: str | None, sqlite_template: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """One ``cosigner serve`` per test module (starting one costs seconds); tests stay
    apart by tenant. Yields ``(url, database_url)``."""
    server, database_url = start_module_server(
        tmp_path_factory.mktemp("client-live"), db_kind=db_kind, pg_url=pg_url,
        sqlite_template=sqlite_template, bundle_dirs=[ROOT / "policies", ROOT / "rego"])
    yield server.url, database_url
    server.stop()


@pytest.fixture
def live(shared_server: tuple[str, str], tenant: str) -> Live:
    """The module's live server with keys for this test's own tenant."""
    url, database_url = shared_server
    return Live(url=url, tenant=tenant, **make_keys(database_url, tenant))


@pytest.fixture
def proxy(live: Live) -> Iterator[FaultProxy]:
    p = FaultProxy(live.url)
    yield p
    p.close()


@pytest.fixture
def quick_expiry_bundles(tmp_path: Path) -> str:
    """A bundle folder whose ``wire_money`` needs finance approval that expires in 1.5 s."""
    bundle = tmp_path / "quick" / "quick"
    bundle.mkdir(parents=True)
    (bundle / "manifest.toml").write_text(
        'id = "quick"\nversion = "1"\nengine = "python"\nentrypoint = "decide"\n'
        'tenants = ["*"]\n')
    (bundle / "rules.py").write_text(
        "def decide(input):\n"
        "    if input['tool']['name'] == 'wire_money':\n"
        "        return {'effect': 'require_approval', 'reasons': [{'code': 'wire'}],\n"
        "                'approval': {'require': [{'role': 'finance', 'count': 1}],\n"
        "                             'timeout_ms': 1500, 'distinct_from': 'initiator'}}\n"
        "    return {'effect': 'allow', 'reasons': [{'code': 'ok'}]}\n")
    return f'["{tmp_path / "quick"}"]'
