"""cosigner.core.metrics.observe records what prometheus-client's Histogram.observe
records (session 8, issue 20): the same sum and bucket counts for any amount — bounds
met exactly, between them, negative, infinite, NaN — and a child bound before the
metrics were made still works."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from cosigner.core.metrics import Metrics, observe

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for metric in registry.collect()
            for s in metric.samples if not s.name.endswith("_created")]


def _same(left: list[tuple[str, dict[str, str], float]],
          right: list[tuple[str, dict[str, str], float]]) -> bool:
    return len(left) == len(right) and all(
        a[:2] == b[:2] and (a[2] == b[2] or (math.isnan(a[2]) and math.isnan(b[2])))
        for a, b in zip(left, right, strict=True))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(BUCKETS) | st.floats(allow_nan=True, allow_infinity=True)
                | st.floats(-1, 10) | st.integers(-3, 10), max_size=20))
def test_observe_records_what_histogram_observe_records(amounts: list[float]) -> None:
    registries = CollectorRegistry(), CollectorRegistry()
    plain, fast = (Histogram("h", "h", ["effect"], buckets=BUCKETS, registry=r)
                   for r in registries)
    for amount in amounts:
        plain.labels("allow").observe(amount)
        observe(fast.labels("allow"), amount)
    assert _same(_samples(registries[0]), _samples(registries[1]))


def test_a_deferred_child_is_observed_through_its_own_observe() -> None:
    metrics = Metrics()
    child = metrics.decision_seconds[("allow", "python")]  # before build(): deferred
    observe(child, 0.003)
    metrics.decided(effect="allow", engine="python", reason="r", bundle="b",
                    seconds=0.0004, policy_seconds=2.0)
    value = metrics.registry.get_sample_value
    labels = {"effect": "allow", "engine": "python"}
    assert value("cosigner_decision_duration_seconds_count", labels) == 2
    assert value("cosigner_decision_duration_seconds_bucket", {**labels, "le": "0.0005"}) == 1
    assert value("cosigner_decision_duration_seconds_bucket", {**labels, "le": "0.005"}) == 2
    assert value("cosigner_decision_duration_seconds_sum", labels) == 0.003 + 0.0004
    assert value("cosigner_policy_evaluation_duration_seconds_count", {"bundle": "b"}) == 1
