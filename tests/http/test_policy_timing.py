"""A policy that ran is counted as run, however fast it was.

``Evaluation.elapsed_us == 0`` means "no policy ran" (a call refused by its run contract
or missing from the tool catalogue, cosigner.decisions.pdp): such decisions are not
observed in ``cosigner_policy_evaluation_duration_seconds`` and log ``eval_us: 0``. A
Python rule evaluated without awaiting (session 10) takes about 1 µs here (almost every
evaluation reads 1 µs on this machine), so on a faster one it reads 0 and would be taken
for "no policy ran". The evaluation is made to fall within one microsecond of the
clock the store reads (``time.perf_counter``, frozen for the policy store only).
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from cosigner.core.metrics import metrics
from cosigner.policy import store
from tests.conftest import decision_request
from tests.http.test_fail_closed import write_bundle

SERIES = "cosigner_policy_evaluation_duration_seconds_count"


def _observed() -> float:
    """Policy evaluations observed, every bundle label together (past the label cap of a
    long session, "quick" is counted as "other")."""
    return sum(s.value for family in metrics().registry.collect() for s in family.samples
               if s.name == SERIES)


def _bundle(root: Path) -> Path:
    return write_bundle(root, "def decide(input):\n    return {'effect': 'deny', "
                        "'reasons': ['no']}\n", name="quick")


async def test_a_policy_faster_than_a_microsecond_is_still_observed(
        harness_factory: Any, tmp_path: Path, tenant: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    h = await harness_factory(bundle_dirs=[_bundle(tmp_path / "bundles")])
    runtime = await h.headers(tenant, "runtime")
    before = _observed()
    monkeypatch.setattr(store, "time", types.SimpleNamespace(perf_counter=lambda: 1.0))
    resp = await h.client.post("/v1/decisions", headers=runtime, json=decision_request())
    monkeypatch.undo()
    assert resp.status_code == 200 and resp.json()["reasons"][0]["code"] == "no"
    assert _observed() - before == 1.0  # the evaluation was observed


async def test_a_fast_evaluation_reads_at_least_one_microsecond(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    policies = store.PolicyStore([_bundle(tmp_path / "bundles")])
    policies.reload()
    monkeypatch.setattr(store, "time", types.SimpleNamespace(perf_counter=lambda: 1.0))
    evaluation = await policies.evaluate("t", {"tool": {"name": "x"}, "args": {}})
    assert evaluation.result.effect == "deny" and evaluation.bundle is not None
    assert evaluation.elapsed_us >= 1
