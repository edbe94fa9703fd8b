"""The tallied hot series (cosigner.core.metrics) read, at every collection, exactly what
prometheus-client's own ``observe``/``inc`` would have stored: generated sequences of
records and scrapes go through a tallying :class:`Metrics` and a plain one, each with its
own registry, and every sample (``_created`` timestamps aside) and the text exposition
must match."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from cosigner.core.metrics import MAX_CHILDREN, Metrics

_amounts = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=2, allow_nan=False),
    st.sampled_from([0.0, 0.0005, 0.001, 0.0025, 1.0, 2.5, 5.0, 7 * 86_400, -0.0]),
    st.integers(min_value=-3, max_value=2000))
_labels = st.sampled_from(["allow", "deny", "x"]) | st.text(max_size=3)
_decided = st.tuples(
    st.just("decided"), st.sampled_from(["allow", "deny", "require_approval"]),
    st.sampled_from(["python", "rego", "none"]), _labels,
    st.none() | st.sampled_from(["b1", "b2"]) | st.text(max_size=2),
    st.floats(min_value=0, max_value=100), st.none() | _amounts,
    st.sampled_from(["on", "shadow"]))
_observe = st.tuples(st.sampled_from(["batch_size", "batch_wait"]),
                     st.sampled_from(["decisions", "refusals"]), _amounts)
_redeem = st.tuples(st.just("redeems"), _labels, st.integers(min_value=0, max_value=3))
_op = st.one_of(_decided, _observe, _redeem, st.just(("scrape",)))


def _apply(m: Metrics, op: tuple[Any, ...]) -> None:
    if op[0] == "decided":
        _, effect, engine, reason, bundle, seconds, policy, mode = op
        m.decided(effect=effect, engine=engine, reason=reason, bundle=bundle,
                  seconds=seconds, policy_seconds=policy, mode=mode)
    elif op[0] == "redeems":
        m.redeems[(op[1],)].inc(op[2])
    elif op[0] != "scrape":
        getattr(m, op[0])[(op[1],)].observe(op[2])


def _samples(registry: CollectorRegistry) -> list[tuple[str, tuple[Any, ...], str]]:
    return [(s.name, tuple(sorted(s.labels.items())), repr(float(s.value)))
            for family in registry.collect() for s in family.samples
            if not s.name.endswith("_created")]


def _text(registry: CollectorRegistry) -> list[bytes]:
    return [line for line in generate_latest(registry).split(b"\n")
            if b"_created" not in line]


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=60), st.booleans())
def test_tallies_read_as_prometheus_client_values(ops: list[tuple[Any, ...]],
                                                  built_first: bool) -> None:
    tallied = Metrics(CollectorRegistry(auto_describe=True), tally=True)
    plain = Metrics(CollectorRegistry(auto_describe=True), tally=False)
    if built_first:
        tallied.build()
        plain.build()
    for op in ops:
        _apply(tallied, op)
        _apply(plain, op)
        if op[0] == "scrape":
            assert _samples(tallied.registry) == _samples(plain.registry)
    assert _samples(tallied.registry) == _samples(plain.registry)
    assert _text(tallied.registry) == _text(plain.registry)
    assert tallied.registry.get_sample_value("cosigner_decisions_total", {
        "effect": "allow", "reason": "allow", "mode": "on"}) == plain.registry.get_sample_value(
        "cosigner_decisions_total", {"effect": "allow", "reason": "allow", "mode": "on"})


def test_open_labels_past_the_cap_share_other_in_both() -> None:
    tallied = Metrics(CollectorRegistry(auto_describe=True), tally=True)
    plain = Metrics(CollectorRegistry(auto_describe=True), tally=False)
    for m in (tallied, plain):
        for i in range(MAX_CHILDREN + 5):
            m.decided(effect="deny", engine="python", reason=f"r{i}", bundle=f"b{i}",
                      seconds=i / 1000, policy_seconds=i / 7000)
    assert _samples(tallied.registry) == _samples(plain.registry)
    assert tallied.registry.get_sample_value("cosigner_decisions_total", {
        "effect": "other", "reason": "other", "mode": "other"}) == 5.0


def test_counter_refuses_a_negative_amount_as_prometheus_client_does() -> None:
    tallied = Metrics(CollectorRegistry(auto_describe=True), tally=True)
    tallied.build()
    child = tallied.redeems[("redeemed",)]
    try:
        child.inc(-1)
    except ValueError:
        pass
    else:
        raise AssertionError("a negative increment was accepted")
    assert tallied.registry.get_sample_value("cosigner_redeems_total",
                                             {"outcome": "redeemed"}) == 0.0


def test_nan_is_summed_and_falls_in_no_bucket() -> None:
    tallied = Metrics(CollectorRegistry(auto_describe=True), tally=True)
    tallied.batch_wait[("decisions",)].observe(math.nan)
    count = tallied.registry.get_sample_value("cosigner_group_commit_wait_seconds_count",
                                              {"writer": "decisions"})
    total = tallied.registry.get_sample_value("cosigner_group_commit_wait_seconds_sum",
                                              {"writer": "decisions"})
    assert count == 0.0 and total is not None and math.isnan(total)
