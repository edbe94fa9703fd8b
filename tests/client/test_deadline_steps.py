"""The gate's failure bounds on a fake clock: the sans-IO protocol (cosigner_client._core)
driven step by step, each attempt using its whole timeout and each back-off its whole
delay. These bounds are exact; tests/client/test_gate.py checks the same behaviour over
real sockets with a margin for a loaded machine."""

from __future__ import annotations

from typing import Any

import pytest
from cosigner_client._breaker import Breaker
from cosigner_client._core import Config, Failure, Http, Protocol, Sleep

ORDER = {"order_id": "ord_8472"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def drive(steps: Any, clock: FakeClock, failure: Failure) -> tuple[Any, list[Http]]:
    """Run ``steps``: every request fails with ``failure`` after its whole timeout
    (``timeout``/``transport``) or at once (``connect``); every sleep takes its delay."""
    attempts: list[Http] = []
    answer: Any = None
    try:
        while True:
            step = steps.send(answer)
            if isinstance(step, Http):
                attempts.append(step)
                if failure.kind != "connect":
                    clock.now += step.timeout
                answer = failure
            else:
                assert isinstance(step, Sleep)
                clock.now += step.seconds
                answer = None
    except StopIteration as done:
        return done.value, attempts


def protocol(clock: FakeClock, **config: Any) -> Protocol:
    return Protocol(config=Config(**config), run="run-1", principal="agent-1", initiator="user-1",
                    clock=clock)


@pytest.mark.parametrize("timeout", [0.5, 0.8, 1.0, 2.0])
def test_a_stalled_server_costs_the_timeout_and_not_a_moment_more(timeout: float) -> None:
    clock = FakeClock()
    started = clock.now
    decision, attempts = drive(protocol(clock, timeout=timeout).decide("get_order", ORDER),
                               clock, Failure("timeout", "read timed out"))
    assert decision.effect == "deny" and decision.reasons[0].code == "timeout"
    assert clock.now - started <= timeout + 1e-9
    # Two attempts of half the timeout each fit; a third would pass the deadline.
    assert [a.timeout for a in attempts][0] == pytest.approx(timeout / 2)
    assert len(attempts) == 2


def test_without_retries_one_attempt_gets_the_whole_timeout() -> None:
    clock = FakeClock()
    decision, attempts = drive(protocol(clock, timeout=0.8, retries=0).decide(
        "get_order", ORDER), clock, Failure("timeout", "read timed out"))
    assert decision.reasons[0].code == "timeout"
    assert [a.timeout for a in attempts] == [pytest.approx(0.8)]
    assert clock.now - 1000.0 == pytest.approx(0.8)


def test_a_refused_connection_retries_with_back_off_inside_the_timeout() -> None:
    clock = FakeClock()
    decision, attempts = drive(protocol(clock, timeout=1.0).decide("get_order", ORDER),
                               clock, Failure("connect", "connection refused"))
    assert decision.effect == "deny" and decision.reasons[0].code == "unavailable"
    assert len(attempts) == 3  # the first try and two retries
    assert clock.now - 1000.0 <= 2 * 0.1  # two back-offs (0.05, then 0.1 at most)


def test_breaker_opens_then_half_opens_on_its_cooldown() -> None:
    clock = FakeClock()
    breaker = Breaker(threshold=3, cooldown=0.5, clock=clock)
    for _ in range(3):
        assert breaker.allow()
        breaker.record(ok=False)
    assert breaker.state == "open" and not breaker.allow()
    clock.now += 0.499
    assert breaker.state == "open" and not breaker.allow()
    clock.now += 0.001
    assert breaker.state == "half_open" and breaker.allow()
    assert not breaker.allow()  # one probe at a time
    breaker.record(ok=False)  # the probe failed: open for another cooldown
    assert breaker.state == "open"
    clock.now += 0.5
    assert breaker.allow()
    breaker.record(ok=True)
    assert breaker.state == "closed" and breaker.allow()
