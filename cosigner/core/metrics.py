"""Prometheus series of one process (README § Operations, Metrics).

One :class:`Metrics` per process, made on first use by :func:`metrics` (never at import
time), like prometheus-client's own default registry: the group committer, the webhook
worker and the approval state machine record into it without being handed the app
context. Label sets are bounded: effects, engines, outcomes and writers are closed sets;
reason codes, refusal codes and bundle ids (operator-defined strings) get a child each up
to :data:`MAX_CHILDREN` distinct values, then share ``"other"``. No label ever holds an id,
a tenant of a request, or a tool name.

Under ``cosigner serve --workers N`` the environment variable ``PROMETHEUS_MULTIPROC_DIR``
is set before any worker starts: prometheus-client then keeps every counter and histogram
in memory-mapped files that :func:`exposition` sums across the workers. Gauges that
describe shared state (pending approvals, active bundles, signing key age) are computed at
scrape time from the database and the process's own view (:mod:`cosigner.http.routes.metrics`).

Hot path: children are bound once and kept in dicts keyed by their label values, so a
decision costs two dict lookups, one ``observe`` and one ``inc``. The series recorded on
the event loop for every decision or redeem (:attr:`Metrics.decision_seconds`,
``decisions``, ``policy_seconds``, ``redeems``, and the group commit's ``batch_size`` /
``batch_wait``) are *tallied*: an ``observe`` or ``inc`` adds to plain Python numbers
(:class:`_TallyHistogram`, :class:`_TallyCounter`, ~0.2 µs instead of prometheus-client's
~1 µs under its value locks), and the tallies are written into the prometheus-client
children when the metric is collected (a scrape, ``get_sample_value``), before it reads
them. The values are the ones the children would hold: each tally keeps its child's
running totals in the same order of additions (tests/core/test_metrics_tally.py compares
the exposition with prometheus-client's own ``observe``/``inc`` on generated sequences).
In multiprocess mode every child is prometheus-client's own: another process scrapes.
"""

from __future__ import annotations

import functools
import os
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

#: Distinct values of an open label (reason code, refusal code, bundle id) kept apart.
MAX_CHILDREN = 64
OTHER = "other"
EFFECTS = ("allow", "deny", "require_approval")
ENGINES = ("python", "rego", "opa", "none")
WRITERS = ("decisions", "refusals")
APPROVAL_OUTCOMES = ("approved", "rejected", "expired", "cancelled")
WEBHOOK_STATUSES = ("delivered", "retry", "failed")

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)
_APPROVAL_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 86_400, 7 * 86_400, 30 * 86_400)


class _Children:
    """Bound children of one metric keyed by label values; open labels are capped.

    The metric itself is made by :meth:`Metrics.build` (prometheus-client imported then);
    until then :meth:`__getitem__` hands out :class:`_Deferred` children."""

    def __init__(self, owner: Metrics, make: Callable[[Any, CollectorRegistry], Any],
                 known: Iterable[tuple[str, ...]] = (), *, tally: bool = False) -> None:
        self._owner = owner
        self._make = make
        self._known = tuple(known)
        self._tally = tally
        self._metric: Any = None
        self._children: dict[tuple[str, ...], Any] = {}

    def _bind(self, prometheus: Any, registry: CollectorRegistry) -> None:
        self._metric = metric = self._make(prometheus, registry)
        if self._tally:
            collect = metric.collect

            def collect_tallied() -> Any:  # the registry calls it on every read
                self.fold()
                return collect()

            metric.collect = collect_tallied
        self._children.update((key, self._child(key)) for key in self._known)

    def _child(self, key: tuple[str, ...]) -> Any:
        real = self._metric.labels(*key)
        if not self._tally:
            return real
        return _TallyHistogram(real) if hasattr(real, "_upper_bounds") else _TallyCounter(real)

    def fold(self) -> None:
        """Write every tally into its prometheus-client child (no-op for plain children)."""
        if self._tally:
            for child in list(self._children.values()):
                child.fold()

    def __getitem__(self, key: tuple[str, ...]) -> Any:
        child = self._children.get(key)
        if child is None:
            if self._metric is None:
                return _Deferred(self, key)
            if len(self._children) >= MAX_CHILDREN:
                key = tuple(OTHER for _ in key)
                child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._child(key)
        return child


class _TallyCounter:
    """A counter child's increments as a plain float, written into the child by
    :meth:`fold`. Single writer (the event loop); the child is written only here."""

    __slots__ = ("_real", "_value")

    def __init__(self, real: Any) -> None:
        self._real = real
        self._value = 0.0  # the child's value: 0.0 + each amount, in order, as inc() adds

    def inc(self, amount: float = 1) -> None:
        """As ``Counter.inc``: ``amount`` must be ≥ 0 (ValueError otherwise)."""
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._value += amount

    def fold(self) -> None:
        self._real._value.set(self._value)


class _TallyHistogram:
    """A histogram child's observations as plain numbers, written into the child by
    :meth:`fold`: per bucket the count of observations it took (the first upper bound
    ≥ the amount, as ``Histogram.observe`` picks it; none for NaN) and the running sum.
    Single writer (the event loop); the child is written only here."""

    __slots__ = ("_real", "_bounds", "_counts", "_sum")

    def __init__(self, real: Any) -> None:
        self._real = real
        self._bounds: list[float] = list(real._upper_bounds)  # ends with +Inf
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0  # 0.0 + each amount, in order, as observe() adds

    def observe(self, amount: float) -> None:
        """As ``Histogram.observe`` (without exemplars)."""
        self._sum += amount
        if amount == amount:  # NaN falls in no bucket
            self._counts[bisect_left(self._bounds, amount)] += 1

    def fold(self) -> None:
        real = self._real
        for value, count in zip(real._buckets, self._counts, strict=True):
            value.set(float(count))
        real._sum.set(self._sum)


class _Deferred:
    """A child bound before the metrics were made (the group committer binds its children
    at startup): its first ``observe``/``inc`` makes them (:meth:`Metrics.build`) and
    puts the real child's bound methods on this object, so later calls cost what a call
    on the real child costs."""

    def __init__(self, children: _Children, key: tuple[str, ...]) -> None:
        self._of = children
        self._key = key

    def _real(self) -> Any:
        self._of._owner.build()
        real = self._of[self._key]
        for name in ("observe", "inc"):
            if hasattr(real, name):
                setattr(self, name, getattr(real, name))
        return real

    def observe(self, amount: float) -> None:  # replaced by the real child's
        self._real().observe(amount)

    def inc(self, amount: float = 1) -> None:  # replaced by the real child's
        self._real().inc(amount)


class Metrics:
    """Every counter and histogram of the process (gauges are built at scrape time).

    prometheus-client (~1.3 MB resident, issue 20) is imported and the metrics registered
    by :meth:`build`: on the first series recorded or on the first read of
    :attr:`registry` (a scrape), all of them at once, in the order below."""

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 tally: bool | None = None) -> None:
        """``tally``: keep the hot series as tallies folded in at collection (see the
        module docstring); by default, unless prometheus-client's multiprocess mode is on."""
        self._tally = multiprocess_dir() is None if tally is None else tally
        self._registry = registry
        self._built = False
        self._lock = threading.Lock()
        self._all: list[_Children] = []
        pairs = [(e, g) for e in EFFECTS for g in ENGINES]
        self.decision_seconds = self._children(lambda p, r: p.Histogram(
            "cosigner_decision_duration_seconds",
            "Time to decide and durably record one decision, by effect and engine.",
            ["effect", "engine"], buckets=_LATENCY_BUCKETS, registry=r), pairs, tally=True)
        self.decisions = self._children(lambda p, r: p.Counter(
            "cosigner_decisions", "Decisions by effect, first reason code and site mode "
            "(``on``, or ``shadow``: asked and recorded, never enforced).",
            ["effect", "reason", "mode"], registry=r), tally=True)
        self.policy_seconds = self._children(lambda p, r: p.Histogram(
            "cosigner_policy_evaluation_duration_seconds",
            "Time the active bundle took to evaluate one input, by bundle id.",
            ["bundle"], buckets=_LATENCY_BUCKETS, registry=r), tally=True)
        self.redeems = self._children(lambda p, r: p.Counter(
            "cosigner_redeems", "Permit redeems: outcome redeemed, or the refusal code.",
            ["outcome"], registry=r), [("redeemed",)], tally=True)
        self.approval_seconds = self._children(lambda p, r: p.Histogram(
            "cosigner_approval_decision_seconds",
            "Time from an approval request opened to its terminal state, by outcome.",
            ["outcome"], buckets=_APPROVAL_BUCKETS, registry=r),
            [(o,) for o in APPROVAL_OUTCOMES])
        self.log_write_failures = self._children(lambda p, r: p.Counter(
            "cosigner_decision_log_write_failures",
            "Writes (decisions, redeems, refusals) whose group-commit batch failed: "
            "each was answered 503 / deny, never acknowledged.",
            ["writer"], registry=r), [(w,) for w in WRITERS])
        self.batch_size = self._children(lambda p, r: p.Histogram(
            "cosigner_group_commit_batch_size", "Writes per group-commit transaction.",
            ["writer"], buckets=_BATCH_BUCKETS, registry=r), [(w,) for w in WRITERS],
            tally=True)
        self.batch_wait = self._children(lambda p, r: p.Histogram(
            "cosigner_group_commit_wait_seconds",
            "Time from the first write of a batch being queued to its COMMIT.",
            ["writer"], buckets=_LATENCY_BUCKETS, registry=r), [(w,) for w in WRITERS],
            tally=True)
        self.webhooks = self._children(lambda p, r: p.Counter(
            "cosigner_webhook_deliveries", "Webhook delivery attempts by result.",
            ["status"], registry=r), [(s,) for s in WEBHOOK_STATUSES])

    def _children(self, make: Callable[[Any, CollectorRegistry], Any],
                  known: Iterable[tuple[str, ...]] = (), *, tally: bool = False) -> _Children:
        """``make(prometheus_client, registry)`` builds the metric at :meth:`build`;
        ``tally``: a hot series recorded on the event loop only (module docstring)."""
        children = _Children(self, make, known, tally=tally and self._tally)
        self._all.append(children)
        return children

    def build(self) -> None:
        """Import prometheus-client and register every metric (once; thread-safe)."""
        if self._built:
            return
        with self._lock:
            if self._built:
                return
            import prometheus_client

            registry = self._registry or prometheus_client.CollectorRegistry(auto_describe=True)
            for children in self._all:
                children._bind(prometheus_client, registry)
            self._registry = registry
            self._built = True

    @property
    def registry(self) -> CollectorRegistry:
        """The registry holding every metric (made by :meth:`build`)."""
        self.build()
        assert self._registry is not None
        return self._registry

    def decided(self, *, effect: str, engine: str, reason: str, bundle: str | None,
                seconds: float, policy_seconds: float | None, mode: str = "on") -> None:
        """Record one recorded decision (``mode``: ``on`` or ``shadow``)."""
        self.decision_seconds[(effect, engine)].observe(seconds)
        self.decisions[(effect, reason, "shadow" if mode == "shadow" else "on")].inc()
        if bundle is not None and policy_seconds is not None:
            self.policy_seconds[(bundle,)].observe(policy_seconds)


@functools.cache
def metrics() -> Metrics:
    """The process's :class:`Metrics` (made on first use)."""
    return Metrics()


def multiprocess_dir() -> str | None:
    """The folder prometheus-client's multiprocess mode writes to, when it is on."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def exposition(extra: Iterable[Metric] = ()) -> bytes:
    """The text exposition (format 0.0.4): this process's series (or, in multiprocess
    mode, every worker's, summed) followed by ``extra`` scrape-time families."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    if multiprocess_dir() is not None:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        body = generate_latest(registry)
    else:
        body = generate_latest(metrics().registry)
    families = list(extra)
    if families:
        scrape = CollectorRegistry(auto_describe=False)
        scrape.register(_Fixed(families))
        body += generate_latest(scrape)
    return body


class _Fixed:
    """A collector that yields metric families computed before the scrape."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families
