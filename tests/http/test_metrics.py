"""GET /metrics and the JSON log of a live ``cosigner serve`` (issue 21): every series moves by
what the traffic did; log lines carry the decision id and never a secret or an argument."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cosigner.core.clock import system_clock
from cosigner.db.database import Database
from cosigner.db.migrate import upgrade
from cosigner.identity.principals import create_api_key
from tests.conftest import Harness, LiveServer, _pg_admin, free_port, start_module_server
from tests.http.approval_helpers import FINANCE, scripted, write_scripted_bundle

METRICS_TOKEN = "metrics-token-0123456789"
CANARY = "canary-7f3a9c1e-do-not-log"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, db_kind: str, pg_url: str | None,
         sqlite_template: Path) -> Iterator[tuple[LiveServer, str]]:
    folder = tmp_path_factory.mktemp("metrics")
    bundles = write_scripted_bundle(folder / "bundles")
    # A rule that fails with the argument value in its message (the log must not copy it).
    (bundles / "scripted" / "rules.py").write_text(
        "def decide(input):\n"
        "    if input['args'].get('boom'):\n"
        "        raise ValueError('bad value ' + input['args']['boom'])\n"
        "    return input['context']['result']\n")
    # The pending-approvals gauge labels the 20 tenants with the most pending requests:
    # on the session's shared PostgreSQL database other tests' tenants would outrank this
    # module's, so on PostgreSQL it gets a database of its own.
    own_pg: str | None = None
    if db_kind == "postgres":
        assert pg_url is not None
        name = f"{pg_url.rsplit('/', 1)[1]}_metrics"
        _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        _pg_admin(f'CREATE DATABASE "{name}"')
        own_pg = pg_url.rsplit("/", 1)[0] + "/" + name
        asyncio.run(upgrade(own_pg))
    server, url = start_module_server(
        folder, db_kind=db_kind, pg_url=own_pg or pg_url, sqlite_template=sqlite_template,
        bundle_dirs=[bundles], args=("--access-log",), COSIGNER_LOG_LEVEL="info",
        COSIGNER_METRICS_TOKEN=METRICS_TOKEN)
    try:
        yield server, url
    finally:
        server.stop()
        if own_pg is not None:
            _pg_admin(f'DROP DATABASE IF EXISTS "{own_pg.rsplit("/", 1)[1]}" WITH (FORCE)')


def keys(database_url: str, tenant: str) -> dict[str, str]:
    async def run() -> dict[str, str]:
        db = Database(database_url)
        try:
            out = {}
            for role in ("runtime", "finance"):
                out[role], _ = await create_api_key(db, tenant=tenant, roles=[role],
                                                    subject=f"{role}-1", clock=system_clock)
            return out
        finally:
            await db.dispose()

    return asyncio.run(run())


def scrape(server: LiveServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    resp = httpx.get(server.url + "/metrics",
                     headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(resp.text) for s in family.samples}


def value(series: dict[Any, float], name: str, **labels: str) -> float:
    return series.get((name, tuple(sorted(labels.items()))), 0.0)


def post(server: LiveServer, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, headers={"Authorization": f"Bearer {key}"},
                      json=body, timeout=10)


def test_metrics_need_the_token(live: tuple[LiveServer, str]) -> None:
    server, _ = live
    assert httpx.get(server.url + "/metrics", timeout=5).status_code == 401
    assert httpx.get(server.url + "/metrics", timeout=5,
                     headers={"Authorization": "Bearer wrong-token-0123456789"}
                     ).status_code == 401


def test_series_move_with_traffic(live: tuple[LiveServer, str], tenant: str) -> None:
    server, database_url = live
    key = keys(database_url, tenant)
    before = scrape(server)

    allow = post(server, key["runtime"], "/v1/decisions",
                 scripted({"effect": "allow", "reasons": ["fine"]}, run="r1")).json()
    assert allow["effect"] == "allow"
    deny = post(server, key["runtime"], "/v1/decisions",
                scripted({"effect": "deny", "reasons": ["nope"]}, run="r1")).json()
    assert deny["effect"] == "deny"
    pending = post(server, key["runtime"], "/v1/decisions",
                   scripted({"effect": "require_approval", "reasons": ["ask"],
                             "approval": FINANCE}, run="r1")).json()
    assert pending["effect"] == "require_approval"
    shadow = post(server, key["runtime"], "/v1/decisions",
                  {**scripted({"effect": "allow", "reasons": ["fine"]}, run="r2"),
                   "mode": "shadow"}).json()
    assert shadow["effect"] == "allow" and shadow["permit"] is None, shadow
    mid = scrape(server)
    assert value(mid, "cosigner_approvals_pending", tenant=tenant) == 1

    review = post(server, key["finance"], f"/v1/approvals/{pending['approval']['id']}/reviews",
                  {"decision": "approved", "comment": "ok"})
    assert review.status_code == 200, review.text
    redeem = {"permit": allow["permit"]["token"], "tool": "delete_file",
              "args": {"path": "/tmp/a"}}
    assert post(server, key["runtime"], "/v1/permits/redeem", redeem).status_code == 200
    again = post(server, key["runtime"], "/v1/permits/redeem", redeem)
    assert again.json()["code"] == "already_redeemed"
    after = scrape(server)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("cosigner_decisions_total", effect="allow", reason="fine", mode="on") == 1
    assert moved("cosigner_decisions_total", effect="deny", reason="nope", mode="on") == 1
    assert moved("cosigner_decisions_total", effect="require_approval", reason="ask",
                 mode="on") == 1
    # Shadow decisions are counted apart (issue 18): asked and recorded, never enforced.
    assert moved("cosigner_decisions_total", effect="allow", reason="fine", mode="shadow") == 1
    for effect, count in (("allow", 2), ("deny", 1), ("require_approval", 1)):  # + shadow
        assert moved("cosigner_decision_duration_seconds_count", effect=effect,
                     engine="python") == count
    assert moved("cosigner_policy_evaluation_duration_seconds_count", bundle="scripted") == 4
    assert moved("cosigner_redeems_total", outcome="redeemed") == 1
    assert moved("cosigner_redeems_total", outcome="already_redeemed") == 1
    assert moved("cosigner_approval_decision_seconds_count", outcome="approved") == 1
    # 3 decisions + 1 redeem (+ the approval's permit is minted in the review's own write)
    assert moved("cosigner_group_commit_batch_size_sum", writer="decisions") == 5
    assert moved("cosigner_group_commit_wait_seconds_count", writer="decisions") >= 1
    assert moved("cosigner_group_commit_batch_size_sum", writer="refusals") == 1  # refused redeem
    assert value(after, "cosigner_decision_log_write_failures_total", writer="decisions") == 0
    assert value(after, "cosigner_approvals_pending", tenant=tenant) == 0
    assert ("cosigner_webhook_deliveries_total", (("status", "delivered"),)) in after
    info = [labels for (name, labels) in after if name == "cosigner_policy_bundle_info"]
    assert [dict(labels)["version"] for labels in info
            if dict(labels)["bundle"] == "scripted"] == ["1.0.0"]
    ages = [v for (name, _), v in after.items() if name == "cosigner_signing_key_age_seconds"]
    assert len(ages) == 1 and ages[0] >= 0
    # bounded labels: no decision, approval or request id anywhere
    text = repr(after)
    for ident in (allow["decision_id"], pending["approval"]["id"], allow["permit"]["jti"]):
        assert ident not in text


def test_json_log_has_decision_id_and_no_secret(live: tuple[LiveServer, str],
                                                tenant: str) -> None:
    server, database_url = live
    key = keys(database_url, tenant)
    body = scripted({"effect": "allow", "reasons": ["fine"]},
                    args={"path": "/tmp/a", "boom": CANARY, "api_token": CANARY})
    resp = post(server, key["runtime"], "/v1/decisions", body)
    assert resp.status_code == 200, resp.text
    decision = resp.json()
    assert decision["effect"] == "deny"  # the rule raised: policy_error
    rid = resp.headers["x-request-id"]

    def read() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        every = [json.loads(line) for line in server.log_path.read_text().splitlines()
                 if line.startswith("{")]
        return every, [line for line in every if line.get("request_id") == rid]

    # The access line is written once the response has been sent: wait for it (bounded).
    deadline = time.monotonic() + 10
    lines, ours = read()
    while time.monotonic() < deadline and not any(
            line["logger"] == "cosigner.access" for line in ours):
        time.sleep(0.05)
        lines, ours = read()
    assert {"timestamp", "level", "logger", "message"} <= set(ours[0])
    errors = [line for line in ours if line["level"] == "error"]
    assert errors and errors[0]["decision_id"] == decision["decision_id"]
    assert errors[0]["tenant"] == tenant and "scripted" in errors[0]["message"]
    assert any(line["logger"] == "cosigner.access" and "/v1/decisions" in line["message"]
               for line in ours)
    started = [line for line in lines if line["message"].startswith("cosigner started:")]
    assert started and "scripted@1.0.0" in started[0]["message"]
    log = server.log_path.read_text()
    assert CANARY not in log
    assert key["runtime"] not in log and METRICS_TOKEN not in log


async def test_metrics_are_off_without_a_token(harness: Harness) -> None:
    resp = await harness.client.get("/metrics")
    assert resp.status_code == 404 and resp.json()["code"] == "not_found"


def test_metrics_on_a_separate_port(tmp_path: Path, db_kind: str, pg_url: str | None,
                                    sqlite_template: Path, tenant: str) -> None:
    port = free_port()
    bundles = write_scripted_bundle(tmp_path / "bundles")
    server, database_url = start_module_server(
        tmp_path, db_kind=db_kind, pg_url=pg_url, sqlite_template=sqlite_template,
        bundle_dirs=[bundles], COSIGNER_METRICS_PORT=str(port))
    try:
        runtime = keys(database_url, tenant)["runtime"]
        assert post(server, runtime, "/v1/decisions", scripted(
            {"effect": "deny", "reasons": ["nope"]})).status_code == 200
        resp = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)  # no token
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/plain")
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(resp.text)
                   for s in family.samples}
        assert value(samples, "cosigner_decisions_total", effect="deny", reason="nope",
                     mode="on") == 1
        assert httpx.get(f"http://127.0.0.1:{port}/other", timeout=10).status_code == 404
        # The API port serves no metrics without a token.
        assert httpx.get(server.url + "/metrics", timeout=10).status_code == 404
    finally:
        server.stop()
