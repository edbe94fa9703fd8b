"""Issue 15: what Cosigner records and reports matches what happened (one live server).

Run contracts registered late (``run_started``), cost declared before the call
(``cost_args``), webhooks for every terminal transition (cancel, expiry), the permit's
state on a revoked approval, and where canonical number equality applies (README).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from cosigner.core.canonical import args_hash
from tests.conftest import ROOT, LiveServer, decision_request, start_module_server
from tests.e2e.helpers import make_keys
from tests.web.conftest import message_request, review_bundle

SLOW, FAST, NOCAT = (f"t-{uuid.uuid4().hex[:10]}" for _ in range(3))


class Receiver:
    """A webhook receiver on loopback that keeps every body it is sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    async def wait_for(self, approval_id: str, status: str) -> dict[str, Any]:
        """The ``approval.decided`` body for ``approval_id`` (the worker polls every 1 s)."""
        for _ in range(300):
            for body in list(self.bodies):
                if (body["type"] == "approval.decided" and body["approval"]["id"] == approval_id
                        and body["approval"]["status"] == status):
                    return body
            await asyncio.sleep(0.1)
        raise AssertionError(f"no approval.decided/{status} webhook for {approval_id}: "
                             f"{self.bodies}")


def _allow_all_bundle(folder: Path, tenant: str) -> None:
    """A Python bundle without a catalogue: every ``pay`` call is allowed."""
    bundle = folder / f"allow-{tenant}"
    bundle.mkdir(parents=True)
    (bundle / "manifest.toml").write_text(
        f'id = "allow-{tenant}"\nversion = "1.0.0"\nengine = "python"\n'
        f'entrypoint = "decide"\ntenants = ["{tenant}"]\n')
    (bundle / "rules.py").write_text(
        "def decide(input):\n    return {'effect': 'allow', 'reasons': ['ok']}\n")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


@pytest.fixture(scope="module")
def live(db_kind: str, pg_url: str | None, sqlite_template: Path, receiver: Receiver,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, str]]:
    folder = tmp_path_factory.mktemp("truth")
    bundles = review_bundle(folder / "slow", SLOW)
    fast = review_bundle(folder / "fast", FAST, timeout_ms=1000)
    extra = folder / "nocat"
    _allow_all_bundle(extra, NOCAT)
    hooks = {t: [{"url": receiver.url, "secret": "whsec-0123456789abcdef"}]
             for t in (SLOW, FAST)}
    server, url = start_module_server(
        folder, db_kind=db_kind, pg_url=pg_url, sqlite_template=sqlite_template,
        bundle_dirs=[ROOT / "policies", bundles, fast, extra],
        COSIGNER_WEBHOOKS=json.dumps(hooks), COSIGNER_SWEEP_EVERY_S="0.2")
    yield server, url
    server.stop()


@pytest.fixture
async def http(live: tuple[LiveServer, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=live[0].url, timeout=30) as client:
        yield client


async def _keys(live: tuple[LiveServer, str], tenant: str) -> dict[str, dict[str, str]]:
    keys = await make_keys(live[1], tenant, {
        "runtime": (["runtime"], "agent-runtime"), "finance": (["finance"], "fiona")})
    return {name: {"Authorization": value} for name, value in keys.items()}


def _refund(run_id: str, amount: Any) -> dict[str, Any]:
    return decision_request(run={"id": run_id}, args={
        "order_id": "ord_1", "amount_minor": amount, "currency": "USD",
        "reason_code": "duplicate_charge"})


# --- gap 3: a contract comes before the run's first call -----------------------------------


async def test_contract_after_the_first_call_is_refused_run_started(
        live: tuple[LiveServer, str], http: httpx.AsyncClient) -> None:
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    keys = await _keys(live, tenant)
    first = await http.post("/v1/decisions", headers=keys["runtime"],
                            json=_refund("run-late", 5000))
    assert first.json()["effect"] == "allow", first.text
    late = await http.post("/v1/runs", headers=keys["runtime"], json={
        "run_id": "run-late", "budget": {"max_tool_calls": 1}})
    assert late.status_code == 409 and late.json()["code"] == "run_started", late.text
    # A run without decisions still takes its contract.
    fresh = await http.post("/v1/runs", headers=keys["runtime"], json={
        "run_id": "run-fresh", "budget": {"max_tool_calls": 1}})
    assert fresh.status_code == 201, fresh.text
    assert (await http.get("/v1/runs/run-late", headers=keys["runtime"])).status_code == 404


# --- gap 4: a declared cost is checked before the call -------------------------------------


async def test_declared_cost_that_would_overshoot_the_budget_is_denied(
        live: tuple[LiveServer, str], http: httpx.AsyncClient) -> None:
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    keys = await _keys(live, tenant)
    contract = {"run_id": "run-cost", "budget": {"max_cost": 10000},
                "cost_args": {"issue_refund": "/amount_minor"}}
    assert (await http.post("/v1/runs", headers=keys["runtime"],
                            json=contract)).status_code == 201
    spent = (await http.post("/v1/decisions", headers=keys["runtime"],
                             json=_refund("run-cost", 9000))).json()
    assert spent["effect"] == "allow", spent
    report = await http.post(f"/v1/decisions/{spent['decision_id']}/outcome",
                             headers=keys["runtime"], json={
                                 "outcome": "ok", "side_effect": "committed",
                                 "cost_minor": 9000})
    assert report.status_code in (200, 201), report.text
    over = (await http.post("/v1/decisions", headers=keys["runtime"],
                            json=_refund("run-cost", 2000))).json()
    assert over["effect"] == "deny"
    assert [r["code"] for r in over["reasons"]] == ["budget_exhausted"]
    fits = (await http.post("/v1/decisions", headers=keys["runtime"],
                            json=_refund("run-cost", 1000))).json()
    assert fits["effect"] == "allow", fits
    assert (await http.get("/v1/runs/run-cost", headers=keys["runtime"])).json()[
        "contract"]["cost_args"] == {"issue_refund": "/amount_minor"}


# --- gap 5: every terminal transition sends a webhook --------------------------------------


async def test_cancellation_sends_an_approval_decided_webhook(
        live: tuple[LiveServer, str], http: httpx.AsyncClient, receiver: Receiver) -> None:
    keys = await _keys(live, SLOW)
    decision = (await http.post("/v1/decisions", headers=keys["runtime"],
                                json=message_request())).json()
    approval_id = decision["approval"]["id"]
    cancelled = await http.post(f"/v1/approvals/{approval_id}/cancel",
                                headers=keys["runtime"])
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    body = await receiver.wait_for(approval_id, "cancelled")
    assert body["approval"]["decided_by"] == ["agent-runtime"]


async def test_expiry_sends_an_approval_decided_webhook(
        live: tuple[LiveServer, str], http: httpx.AsyncClient, receiver: Receiver) -> None:
    keys = await _keys(live, FAST)
    decision = (await http.post("/v1/decisions", headers=keys["runtime"],
                                json=message_request())).json()
    approval_id = decision["approval"]["id"]
    body = await receiver.wait_for(approval_id, "expired")  # the sweep, every 0.2 s
    assert body["approval"]["args"]["body"] == "hello"


# --- gap 6: a revoked permit shows as revoked ----------------------------------------------


async def test_approval_whose_permit_was_revoked_shows_the_revoked_permit(
        live: tuple[LiveServer, str], http: httpx.AsyncClient) -> None:
    keys = await _keys(live, SLOW)
    decision = (await http.post("/v1/decisions", headers=keys["runtime"],
                                json=message_request())).json()
    approval_id = decision["approval"]["id"]
    approved = await http.post(f"/v1/approvals/{approval_id}/reviews",
                               headers=keys["finance"],
                               json={"decision": "approved", "comment": "ok"})
    assert approved.status_code == 200, approved.text
    state = (await http.get(f"/v1/approvals/{approval_id}", headers=keys["runtime"])).json()
    assert state["permit_status"] == "issued" and state["permit"]["jti"]
    jti = state["permit"]["jti"]
    revoked = await http.post(f"/v1/permits/{jti}/revoke", headers=keys["finance"])
    assert revoked.status_code == 200, revoked.text
    state = (await http.get(f"/v1/approvals/{approval_id}", headers=keys["runtime"])).json()
    assert state["status"] == "approved"  # what happened to the request stands
    assert state["permit_status"] == "revoked" and state["permit"] is None


# --- gap 7: canonical equality is the hash's; the catalogue's types are stricter ----------

README_CLAIM = re.compile(r"`100000` and `100000\.0` hash the same")


async def test_readme_number_claim_holds(live: tuple[LiveServer, str],
                                         http: httpx.AsyncClient) -> None:
    readme = (ROOT / "README.md").read_text()
    assert README_CLAIM.search(readme) and "refuses `100000.0`" in readme
    # The args hash: the same call either way.
    assert args_hash({"amount": 100000}) == args_hash({"amount": 100000.0})
    # Without a catalogue (or with type: number) a permit for one redeems the other.
    keys = await _keys(live, NOCAT)
    allowed = (await http.post("/v1/decisions", headers=keys["runtime"], json=decision_request(
        tool={"name": "pay"}, args={"amount": 100000}))).json()
    assert allowed["effect"] == "allow", allowed
    assert allowed["args_hash"] == args_hash({"amount": 100000.0})
    redeemed = await http.post("/v1/permits/redeem", headers=keys["runtime"], json={
        "permit": allowed["permit"]["token"], "tool": "pay", "args": {"amount": 100000.0}})
    assert redeemed.status_code == 200, redeemed.text
    # The reference catalogue's `type: integer` refuses 100000.0 before any policy runs.
    refunds = await _keys(live, f"t-{uuid.uuid4().hex[:10]}")
    refused = await http.post("/v1/decisions", headers=refunds["runtime"],
                              json=_refund("run-num", 100000.0))
    assert refused.status_code == 422 and refused.json()["code"] == "invalid_args"
    ok = (await http.post("/v1/decisions", headers=refunds["runtime"],
                          json=_refund("run-num", 5000))).json()
    refused = await http.post("/v1/permits/redeem", headers=refunds["runtime"], json={
        "permit": ok["permit"]["token"], "tool": "issue_refund",
        "args": {"order_id": "ord_1", "amount_minor": 5000.0, "currency": "USD",
                 "reason_code": "duplicate_charge"}})
    assert (refused.status_code, refused.json()["code"]) == (403, "invalid_args")
