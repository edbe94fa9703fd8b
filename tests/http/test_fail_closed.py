"""Fail closed (invariant 1) through the HTTP API: no bundle, raising rules, bad shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.db.tables import audit_events
from tests.conftest import decision_request


def write_bundle(root: Path, rules: str, *, name: str = "b") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "manifest.toml").write_text(
        f'id = "{name}"\nversion = "1"\nengine = "python"\nentrypoint = "decide"\n'
        'tenants = ["*"]\n')
    (folder / "rules.py").write_text(rules)
    return root


async def test_k01_no_bundle_loaded_denies_and_is_not_ready(harness_factory: Any,
                                                            tmp_path: Path,
                                                            tenant: str) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    h = await harness_factory(bundle_dirs=[empty])
    ready = await h.client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["policies"] is False
    resp = await h.client.post("/v1/decisions", headers=await h.headers(tenant, "runtime"),
                               json=decision_request())
    assert resp.status_code == 200
    body = resp.json()
    assert body["effect"] == "deny"
    assert body["reasons"][0]["code"] == "policy_not_loaded"
    assert body["permit"] is None
    async with h.db.read() as conn:
        effects = (await conn.execute(select(audit_events.c.effect).where(
            audit_events.c.tenant == tenant,
            audit_events.c.type == "decision.made"))).scalars().all()
    assert effects == ["deny"]


@pytest.mark.parametrize(("rules", "code"), [
    ("def decide(input):\n    return input['args']['missing']\n", "policy_error"),  # KeyError
    ("def decide(input):\n    return None\n", "undefined"),
    ("def decide(input):\n    return 'allow'\n", "policy_error"),
    ("def decide(input):\n    return True\n", "policy_error"),
    ("def decide(input):\n    return {'effect': 'ALLOW'}\n", "policy_error"),
    ("def decide(input):\n    return {'allowed': True}\n", "policy_error"),
    ("def decide(input):\n    return {'effect': 'allow', 'approved': True}\n", "policy_error"),
    ("def decide(input):\n    return {'effect': 'require_approval'}\n", "policy_error"),
    ("def decide(input):\n    return {'effect': 'require_approval', "
     "'approval': {'require': []}}\n", "policy_error"),
    ("def decide(input):\n    return {'effect': 'require_approval', "
     "'approval': {'require': [{'role': 'finance', 'count': 1}], 'timeout_ms': 0}}\n",
     "policy_error"),
])
async def test_k04_k15_faulty_rules_deny(harness_factory: Any, tmp_path: Path, tenant: str,
                                         rules: str, code: str,
                                         caplog: pytest.LogCaptureFixture) -> None:
    h = await harness_factory(bundle_dirs=[write_bundle(tmp_path / "bundles", rules)])
    resp = await h.client.post("/v1/decisions", headers=await h.headers(tenant, "runtime"),
                               json=decision_request())
    body = resp.json()
    assert resp.status_code == 200
    assert body["effect"] == "deny"
    assert body["reasons"][0]["code"] == code
    assert body["permit"] is None and body["approval"] is None
    if code == "policy_error":
        assert any(r.levelname == "ERROR" and "b@1" in r.getMessage() for r in caplog.records)


async def test_a_stopped_log_writer_fails_liveness_and_readiness(harness: Any,
                                                               tenant: str) -> None:
    """A decision log writer whose drain task ended (a fault in the task, here a cancel)
    refuses every write with 503: /healthz and /readyz say so, so an orchestrator
    restarts the process instead of leaving it up refusing."""
    assert (await harness.client.get("/healthz")).json() == {
        "status": "ok", "checks": {"log_writer": True}}
    writer = harness.context.log_writer
    writer._task.cancel()  # noqa: SLF001 - the task ends as on a fault
    with pytest.raises(BaseException):  # noqa: B017 - cancelled or the fault, either way
        await writer._task  # noqa: SLF001
    live = await harness.client.get("/healthz")
    assert live.status_code == 503
    assert live.json() == {"status": "failed", "checks": {"log_writer": False}}
    ready = await harness.client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["log_writer"] is False
    resp = await harness.client.post("/v1/decisions",
                                     headers=await harness.headers(tenant, "runtime"),
                                     json=decision_request())
    assert resp.status_code == 503
    assert resp.json()["code"] == "storage_unavailable"
