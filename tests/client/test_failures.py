"""The client names every failure (issue 19): each of the ten kinds produced from a real
cause against a live ``cosigner serve`` — a real 429, a real overload (small bounds via
settings), a cancelled call, garbage through the fault-injecting proxy — and the fail
direction each gate applies (deny by default; ``proceed`` / ``ask`` by name, recorded)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cosigner_client import AsyncGate, Gate
from cosigner_client.errors import FAILURE_KINDS, GateError

from cosigner.core.clock import system_clock
from cosigner.db.database import Database
from cosigner.identity.principals import create_api_key
from tests.client.conftest import ACTORS, REFUND
from tests.client.netfaults import FaultProxy
from tests.conftest import ROOT, free_port, start_module_server

ORDER = {"order_id": "ord_8472"}
UNLIMITED = {"credential_per_s": 0, "credential_burst": 0, "tenant_per_s": 0,
             "tenant_burst": 0, "decisions_per_min": 0, "approvals_per_min": 0}


@dataclass
class Strict:
    """A live server with small bounds: ``limited`` may send 1 request per second per
    credential (counted over 10 s); ``quota1``/``quota2`` 1 decision per minute;
    ``hooked`` has a webhook receiver that refuses and a backlog bound of 1; bodies are
    limited to 2 KiB."""

    url: str
    database_url: str
    limited: str
    quota1: str
    quota2: str
    hooked: str

    def key(self, tenant: str, *roles: str) -> str:
        async def run() -> str:
            db = Database(self.database_url)
            try:
                key, _ = await create_api_key(db, tenant=tenant, roles=list(roles or
                                                                          ("runtime",)),
                                              subject=f"rt-{uuid.uuid4().hex[:8]}",
                                              clock=system_clock)
                return key
            finally:
                await db.dispose()
        return asyncio.run(run())


@pytest.fixture(scope="module")
def strict(db_kind: str, pg_url: str | None, sqlite_template: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Strict]:
    limited, hooked = f"t-rl-{uuid.uuid4().hex[:8]}", f"t-wh-{uuid.uuid4().hex[:8]}"
    quota1, quota2 = f"t-q1-{uuid.uuid4().hex[:8]}", f"t-q2-{uuid.uuid4().hex[:8]}"
    server, database_url = start_module_server(
        tmp_path_factory.mktemp("client-failures"), db_kind=db_kind, pg_url=pg_url,
        sqlite_template=sqlite_template, bundle_dirs=[ROOT / "policies", ROOT / "rego"],
        COSIGNER_RATE_LIMITS=json.dumps({
            "*": UNLIMITED, limited: {**UNLIMITED, "credential_per_s": 1},
            quota1: {**UNLIMITED, "decisions_per_min": 1},
            quota2: {**UNLIMITED, "decisions_per_min": 1}}),
        COSIGNER_MAX_BODY_BYTES="2048",
        COSIGNER_WEBHOOKS=json.dumps({hooked: [{"url": "http://127.0.0.1:9/hook",
                                                "secret": "s" * 32}]}),
        COSIGNER_WEBHOOK_BACKLOG_MAX="1")
    yield Strict(server.url, database_url, limited, quota1, quota2, hooked)
    server.stop()


@pytest.fixture
def tenant_key(strict: Strict) -> str:
    return strict.key(f"t-{uuid.uuid4().hex[:10]}")


def gate(url: str, key: str, **kw: Any) -> Gate:
    kw.setdefault("run", "run-failures")
    return Gate(url, key, **ACTORS, **kw)


class Tool:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, **_: Any) -> str:
        self.calls += 1
        return "done"


def _spend(strict: Strict, key: str, path: str = "/v1/tools") -> None:
    """Use up a limit with raw requests until one is refused (429)."""
    headers = {"Authorization": f"Bearer {key}"}
    body = {"request_id": f"req-{uuid.uuid4().hex}", "run": {"id": "run-spend"}, **ACTORS,
            "tool": {"name": "get_order"}, "args": ORDER, "context": {}}
    for _ in range(30):
        response = (httpx.post(strict.url + path, headers=headers, json=body, timeout=5)
                    if path == "/v1/decisions" else
                    httpx.get(strict.url + path, headers=headers, timeout=5))
        if response.status_code == 429:
            assert int(response.headers["retry-after"]) >= 1
            return
    raise AssertionError("the limit never refused")


def _failure(decision_error: GateError | None, kind: str) -> GateError:
    assert decision_error is not None
    assert decision_error.kind == kind, decision_error
    assert kind in FAILURE_KINDS
    return decision_error


# ------------------------------------------------------------------- the ten kinds


def test_auth_invalid_and_too_large_come_from_the_server(strict: Strict,
                                                         tenant_key: str) -> None:
    with gate(strict.url, "csk_not-a-key", retries=0) as g:
        assert _failure(g.decide("get_order", ORDER).error, "auth").status == 401
    auditor = strict.key(f"t-{uuid.uuid4().hex[:10]}", "auditor")
    with gate(strict.url, auditor, retries=0) as g:  # a key without the runtime role
        assert _failure(g.decide("get_order", ORDER).error, "auth").status == 403
    with gate(strict.url, tenant_key, retries=0) as g:
        invalid = g.decide("get_order", {"order_id": "not an order id"})
        assert invalid.effect == "deny"
        assert _failure(invalid.error, "invalid").code == "invalid_args"
        big = g.decide("search_policy", {"query": "x" * 4000})
        assert big.effect == "deny" and _failure(big.error, "too_large").status == 413


def test_rate_limited_carries_retry_after_and_denies(strict: Strict) -> None:
    key = strict.key(strict.quota1)
    _spend(strict, key, "/v1/decisions")
    tool = Tool()
    # Retry-After (≥ 1 s) does not fit in a 0.5 s deadline: answered at once, denied.
    with gate(strict.url, key, timeout=0.5) as g:
        result = g.call("get_order", ORDER, tool)
    assert result.status == "denied" and tool.calls == 0
    error = _failure(result.decision.error, "rate_limited")
    assert error.code == "rate_limited" and error.retry_after is not None
    assert result.failure == "rate_limited" and result.fail_direction == "deny"


def test_rate_limited_is_retried_after_retry_after_within_the_deadline(
        strict: Strict) -> None:
    # 1/s sustained: the sliding window frees a slot about every second, so on a loaded
    # machine the gate's first request may already find one (admitted at once, nothing to
    # wait for); then spend again with a fresh credential, a few times at most.
    posts = 0
    for _ in range(4):
        key = strict.key(strict.limited)
        proxy = FaultProxy(strict.url)
        try:
            _spend(strict, key)
            with gate(proxy.url, key, timeout=15, retries=4) as g:
                decision = g.decide("get_order", ORDER)
            assert decision.effect == "allow", decision.error
            posts = proxy.seen["POST /v1/decisions"]
        finally:
            proxy.close()
        if posts >= 2:  # refused first, then waited Retry-After and admitted
            break
    assert posts >= 2


def test_overloaded_when_a_server_bound_is_full(strict: Strict) -> None:
    key = strict.key(strict.hooked)
    with gate(strict.url, key, retries=0) as g:
        first = g.decide("issue_refund", REFUND, run="run-a")
        assert first.effect == "require_approval"
        # The delivery worker counts the backlog (1 undelivered) within a poll or two.
        deadline = time.monotonic() + 15
        while True:
            later = g.decide("issue_refund", REFUND, run=f"run-{uuid.uuid4().hex[:6]}")
            if later.error is not None or time.monotonic() > deadline:
                break
            time.sleep(0.3)
    error = _failure(later.error, "overloaded")
    assert error.status == 503 and error.retry_after is not None
    assert later.effect == "deny"


def test_timeout_unavailable_and_breaker_open(strict: Strict, tenant_key: str) -> None:
    proxy = FaultProxy(strict.url)
    try:
        proxy.plan["POST /v1/decisions"] = ["stall:2"]
        with gate(proxy.url, tenant_key, timeout=0.5, retries=0) as g:
            _failure(g.decide("get_order", ORDER).error, "timeout")
    finally:
        proxy.close()
    closed = f"http://127.0.0.1:{free_port()}"
    with gate(closed, tenant_key, retries=0, breaker_threshold=1) as g:
        _failure(g.decide("get_order", ORDER).error, "unavailable")
        _failure(g.decide("get_order", ORDER).error, "breaker_open")


def test_malformed_answers_fail_closed(strict: Strict, tenant_key: str) -> None:
    proxy = FaultProxy(strict.url)
    try:
        proxy.plan["POST /v1/decisions"] = ["garbage", "reshape"]
        tool = Tool()
        with gate(proxy.url, tenant_key, retries=0) as g:
            garbled = g.call("get_order", ORDER, tool)
            reshaped = g.decide("get_order", ORDER)
        assert garbled.status == "denied" and tool.calls == 0
        assert garbled.failure == "malformed"
        _failure(reshaped.error, "malformed")
        # A garbled answer to a redeem is a lost answer: the gate asks the permit's state
        # and runs the tool once, because the redeem was its own.
        proxy.plan["POST /v1/permits/redeem"] = ["garbage"]
        with gate(proxy.url, tenant_key, retries=0) as g:
            ran = g.call("get_order", ORDER, tool)
        assert ran.status == "executed" and tool.calls == 1
        assert ran.redemption is not None and ran.redemption.recovered
    finally:
        proxy.close()


async def test_aborted_by_the_caller(strict: Strict, tenant_key: str) -> None:
    abort = asyncio.Event()
    async with AsyncGate(strict.url, tenant_key, run="run-abort", **ACTORS) as g:
        decision = await g.decide("issue_refund", REFUND)
        assert decision.effect == "require_approval"
        asyncio.get_running_loop().call_later(0.3, abort.set)
        approval = await g.wait_for_approval(decision, timeout=20, abort=abort)
        assert approval.status == "pending"
        _failure(approval.error, "aborted")
        tool = Tool()
        result = await g.call("get_order", ORDER, tool, abort=abort)  # already aborted
    assert result.status == "denied" and result.failure == "aborted" and tool.calls == 0
    stopped = threading.Event()
    stopped.set()
    with gate(strict.url, tenant_key, fail_directions={"get_order": "proceed"}) as sync:
        # Aborting never proceeds, whatever the tool's fail direction.
        _failure(sync.decide("get_order", ORDER, abort=stopped).error, "aborted")


# ------------------------------------------------------------------- fail directions


def test_fail_direction_proceed_and_ask_are_opt_ins_recorded_in_the_result(
        strict: Strict) -> None:
    key = strict.key(strict.quota2)
    asked: list[tuple[str, str]] = []

    def ask_human(tool: str, args: dict[str, Any], error: GateError) -> bool:
        asked.append((tool, error.kind))
        return tool == "get_refund_status"

    directions = {"get_order": "proceed", "get_refund_status": "ask",
                  "get_payment_events": "ask"}
    tool = Tool()
    with gate(strict.url, key, timeout=0.5, fail_directions=directions,
              ask_human=ask_human) as g:
        _spend(strict, key, "/v1/decisions")
        proceeded = g.call("get_order", ORDER, tool)
        approved = g.call("get_refund_status", ORDER, tool)
        refused = g.call("get_payment_events", ORDER, tool)
        denied = g.call("search_policy", {"query": "refunds"}, tool)
    assert (proceeded.status, proceeded.fail_direction) == ("proceeded_on_timeout",
                                                            "proceed")
    assert proceeded.decision.fail_open and proceeded.failure == "rate_limited"
    assert (approved.status, approved.fail_direction) == ("approved_by_human_on_failure",
                                                          "ask")
    assert (refused.status, refused.fail_direction) == ("denied", "ask")
    assert (denied.status, denied.fail_direction) == ("denied", "deny")
    assert asked == [("get_refund_status", "rate_limited"),
                     ("get_payment_events", "rate_limited")]
    assert tool.calls == 2
    # Failures that are the caller's own (auth) deny even for a "proceed" tool.
    with gate(strict.url, "csk_wrong", fail_directions=directions, ask_human=ask_human) as g:
        wrong = g.call("get_order", ORDER, tool)
    assert wrong.status == "denied" and wrong.failure == "auth" and tool.calls == 2


def test_ask_direction_needs_a_person_to_ask() -> None:
    with pytest.raises(TypeError):
        Gate("http://127.0.0.1:1", "k", fail_directions={"get_order": "ask"})
    with pytest.raises(ValueError):
        Gate("http://127.0.0.1:1", "k", fail_directions={"get_order": "maybe"})  # type: ignore[dict-item]
