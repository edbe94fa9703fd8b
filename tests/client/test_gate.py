"""cosigner-client against a live ``cosigner serve`` (no mocks): every gate, every
failure mode. Faults are real: a port with nothing listening, a socket that never
answers, a proxy that loses responses (tests/client/netfaults.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from cosigner_client import AsyncGate, CallRefused, Gate

from tests.client.conftest import ACTORS, REFUND, Live
from tests.client.netfaults import FaultProxy, StalledSocket
from tests.conftest import free_port

ORDER = {"order_id": "ord_8472"}


def gate(url: str, key: str, **kw: Any) -> Gate:
    kw.setdefault("run", "run-client")
    return Gate(url, key, **ACTORS, **kw)


class Tool:
    """A stand-in tool that counts its executions."""

    def __init__(self, result: Any = "done") -> None:
        self.calls: list[dict[str, Any]] = []
        self.result = result

    def __call__(self, **args: Any) -> Any:
        self.calls.append(args)
        return self.result


def approve_soon(live: Live, approval_id: str, decision: str = "approved",
                 after: float = 0.3) -> threading.Thread:
    def run() -> None:
        time.sleep(after)
        resp = live.review(approval_id, decision)
        assert resp.status_code == 200, resp.text

    thread = threading.Thread(target=run)
    thread.start()
    return thread


# --------------------------------------------------------------------- the three gates


def test_allow_runs_the_tool_once_and_reports(live: Live) -> None:
    tool = Tool({"status": "paid"})
    with gate(live.url, live.runtime) as g:
        result = g.call("get_order", ORDER, tool, side_effect="read")
    assert result.status == "executed" and result.value == {"status": "paid"}
    assert tool.calls == [ORDER]
    assert result.redemption is not None and result.redemption.ok
    assert result.outcome is not None and result.outcome.ok
    assert (result.outcome.outcome, result.outcome.side_effect) == ("ok", "none")


def test_deny_never_runs_the_tool(live: Live) -> None:
    tool = Tool()
    with gate(live.url, live.runtime) as g:
        result = g.call("issue_refund", {**REFUND, "amount_minor": 250000}, tool)
    assert result.status == "denied" and result.code == "over_hard_limit"
    assert tool.calls == []
    with pytest.raises(CallRefused) as info:
        result.unwrap()
    assert info.value.code == "over_hard_limit"


def test_approve_then_redeem_and_run_once(live: Live) -> None:
    tool = Tool("refunded")
    with gate(live.url, live.runtime) as g:
        decision = g.decide("issue_refund", REFUND)
        assert decision.effect == "require_approval" and decision.approval is not None
        approve_soon(live, decision.approval.id)
        approval = g.wait_for_approval(decision, timeout=10)
        assert approval.status == "approved" and approval.permit is not None
        redemption = g.redeem(approval.permit, "issue_refund", REFUND)
        assert redemption.ok
        assert g.redeem(approval.permit, "issue_refund", REFUND).code == "already_redeemed"
        changed = {**REFUND, "amount_minor": 200001}
        assert g.redeem(approval.permit, "issue_refund", changed).ok is False
        report = g.report_outcome(decision, "ok", "committed", cost_minor=200000)
        assert report.ok
        assert g.report_outcome(decision, "ok", "committed", cost_minor=200000).ok
        conflict = g.report_outcome(decision, "error", "unknown")
        assert not conflict.ok and conflict.error is not None
        assert conflict.error.code == "outcome_conflict"
    assert tool.calls == []


def test_call_waits_for_approval(live: Live) -> None:
    tool = Tool("refunded")
    with gate(live.url, live.runtime) as g:
        pending = g.decide("issue_refund", REFUND)  # the call below joins this request
        assert pending.approval is not None
        approve_soon(live, pending.approval.id, after=0.5)
        result = g.call("issue_refund", REFUND, tool, side_effect="financial",
                        approval_timeout=10)
    assert result.status == "executed", result
    assert tool.calls == [REFUND]
    assert result.outcome is not None and result.outcome.side_effect == "committed"


def test_reject_never_runs_the_tool(live: Live) -> None:
    tool = Tool()
    with gate(live.url, live.runtime) as g:
        pending = g.decide("issue_refund", REFUND)
        assert pending.approval is not None
        approve_soon(live, pending.approval.id, decision="rejected")
        result = g.call("issue_refund", REFUND, tool, approval_timeout=10)
    assert result.status == "approval_rejected" and tool.calls == []


def test_expired_approval_never_runs_the_tool(live_factory: Callable[..., Live],
                                              quick_expiry_bundles: str) -> None:
    live = live_factory(COSIGNER_BUNDLE_DIRS=quick_expiry_bundles)
    tool = Tool()
    with gate(live.url, live.runtime) as g:
        result = g.call("wire_money", {"to": "acct_1", "amount_minor": 10}, tool,
                        approval_timeout=10)
    assert result.status == "approval_expired" and tool.calls == []
    assert result.approval is not None
    late = live.review(result.approval.id)
    assert late.status_code == 409  # approving an expired request (K12)


def test_client_stops_waiting_and_does_not_run(live: Live) -> None:
    tool = Tool()
    with gate(live.url, live.runtime) as g:
        started = time.monotonic()
        result = g.call("issue_refund", REFUND, tool, approval_timeout=0.5)
    assert result.status == "approval_timeout" and result.code == "timeout"
    assert time.monotonic() - started < 3
    assert tool.calls == []


async def test_async_gate_and_guard(live: Live) -> None:
    tool_calls: list[str] = []
    async with AsyncGate(live.url, live.runtime, run="run-async", **ACTORS) as g:
        @g.guard("get_order", side_effect="read")
        async def get_order(order_id: str = "ord_8472") -> str:
            tool_calls.append(order_id)
            return f"order {order_id}"

        # Defaults are bound into the hashed args: what is decided is what runs (K07).
        assert await get_order() == "order ord_8472"

        @g.guard("issue_refund")
        async def issue_refund(order_id: str, amount_minor: int, currency: str,
                               reason_code: str) -> None:
            raise AssertionError("must not run")

        with pytest.raises(CallRefused):
            await issue_refund("ord_8472", 250000, "USD", "duplicate_charge")
        results = await asyncio.gather(*(g.decide("get_order", ORDER) for _ in range(5)))
        assert {r.effect for r in results} == {"allow"}
    assert tool_calls == ["ord_8472"]


def test_tool_exception_is_reported_and_reraised(live: Live) -> None:
    class Boom(Exception):
        side_effect = "not_executed"

    def broken(**_: Any) -> None:
        raise Boom("card network down")

    with gate(live.url, live.runtime) as g:
        with pytest.raises(Boom):
            g.call("get_order", ORDER, broken)


def test_start_run_enforces_the_contract(live: Live) -> None:
    tool = Tool()
    with gate(live.url, live.runtime, run=None) as g:
        run = g.start_run("run-contract", allowed_tools=["get_order"], max_tool_calls=2)
        assert run.contract["allowed_tools"] == ["get_order"] and g.run == {"id": "run-contract"}
        assert g.call("get_order", ORDER, tool).status == "executed"
        assert g.call("issue_refund", {**REFUND, "amount_minor": 10}, tool).code == (
            "outside_contract")
        assert g.call("get_order", ORDER, tool).status == "executed"
        assert g.call("get_order", ORDER, tool).code == "budget_exhausted"
    assert len(tool.calls) == 2


# --------------------------------------------------------------------- failure modes


def test_server_down_denies_within_the_timeout() -> None:
    tool = Tool()
    url = f"http://127.0.0.1:{free_port()}"
    with gate(url, "csk_0000000000000000_" + "a" * 43, timeout=1.0) as g:
        started = time.monotonic()
        result = g.call("get_order", ORDER, tool)
        elapsed = time.monotonic() - started
    assert result.status == "denied" and result.code == "unavailable"
    assert result.decision.decision_id is None
    # Exact bounds on a fake clock: test_deadline_steps.py; here a loaded machine's margin.
    assert elapsed < 1.0 + 1.0 and tool.calls == []


def test_stalled_server_denies_within_the_timeout() -> None:
    stalled = StalledSocket()
    tool = Tool()
    try:
        with gate(stalled.url, "csk_0000000000000000_" + "a" * 43, timeout=0.8) as g:
            started = time.monotonic()
            result = g.call("get_order", ORDER, tool)
            elapsed = time.monotonic() - started
    finally:
        stalled.close()
    assert result.status == "denied" and result.code == "timeout"
    assert elapsed < 0.8 + 1.0 and tool.calls == []  # it never answers


def test_slow_server_behind_proxy_denies_within_the_timeout(live: Live,
                                                            proxy: FaultProxy) -> None:
    proxy.plan["POST /v1/decisions"] = ["stall:3", "stall:3", "stall:3"]
    with gate(proxy.url, live.runtime, timeout=1.0) as g:
        started = time.monotonic()
        decision = g.decide("get_order", ORDER)
        elapsed = time.monotonic() - started
    assert decision.effect == "deny" and decision.reason == "timeout"
    assert elapsed < 1.0 + 1.0  # not the 3 s stall


def test_proceed_on_timeout_only_for_tools_named(live: Live) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    tool = Tool("cached")
    with gate(url, live.runtime, timeout=0.5, proceed_on_timeout={"get_order"}) as g:
        named = g.call("get_order", ORDER, tool)
        other = g.call("get_refund_status", ORDER, tool)
    assert named.status == "proceeded_on_timeout" and named.decision.fail_open
    assert named.decision.reason == "proceeded_on_timeout"
    assert other.status == "denied"
    assert tool.calls == [ORDER]


def test_breaker_opens_then_half_opens(live: Live, proxy: FaultProxy) -> None:
    proxy.plan["POST /v1/decisions"] = ["503"] * 4
    # Over real sockets, the open breaker must still be open at the next call: a cooldown a
    # loaded machine cannot outlast between two lines (exact: test_deadline_steps.py).
    with gate(proxy.url, live.runtime, retries=0, breaker_threshold=3,
              breaker_cooldown=1.5) as g:
        for _ in range(3):
            assert g.decide("get_order", ORDER).reason == "unavailable"
        assert g.breaker.state == "open"
        before = proxy.seen["POST /v1/decisions"]
        blocked = g.decide("get_order", ORDER)
        assert blocked.reason == "breaker_open" and blocked.effect == "deny"
        assert proxy.seen["POST /v1/decisions"] == before  # not even asked
        time.sleep(1.6)
        assert g.breaker.state == "half_open"
        assert g.decide("get_order", ORDER).reason == "unavailable"  # the probe failed
        assert g.breaker.state == "open"
        time.sleep(1.6)
        assert g.decide("get_order", ORDER).effect == "allow"  # the probe succeeded
        assert g.breaker.state == "closed"


def test_decide_retry_returns_the_same_decision(live: Live, proxy: FaultProxy) -> None:
    proxy.plan["POST /v1/decisions"] = ["lose", "503"]
    with gate(proxy.url, live.runtime, timeout=3.0) as g:
        decision = g.decide("get_order", ORDER, request_id="req-retry-1")
        assert decision.effect == "allow" and decision.decision_id is not None
        assert proxy.forwarded["POST /v1/decisions"] == 2  # the lost one and the retry
        again = g.decide("get_order", ORDER, request_id="req-retry-1")
    assert again.decision_id == decision.decision_id
    headers = {"Authorization": f"Bearer {live.runtime}"}
    assert decision.permit is not None
    state = httpx.get(f"{live.url}/v1/permits/{decision.permit.jti}", headers=headers).json()
    assert state["decision_id"] == decision.decision_id


def test_redeem_after_lost_response_runs_once(live: Live, proxy: FaultProxy) -> None:
    proxy.plan["POST /v1/permits/redeem"] = ["lose"]
    tool = Tool()
    with gate(proxy.url, live.runtime) as g:
        result = g.call("get_order", ORDER, tool)
    assert result.status == "executed"
    assert result.redemption is not None and result.redemption.recovered
    assert proxy.forwarded["POST /v1/permits/redeem"] == 1  # never retried blindly
    assert sum(n for k, n in proxy.seen.items() if k.startswith("GET /v1/permits/")) == 1
    assert tool.calls == [ORDER]


def test_redeem_refused_upstream_retries_only_after_asking(live: Live,
                                                          proxy: FaultProxy) -> None:
    proxy.plan["POST /v1/permits/redeem"] = ["503"]  # answered without reaching the server
    tool = Tool()
    with gate(proxy.url, live.runtime) as g:
        result = g.call("get_order", ORDER, tool)
    assert result.status == "executed" and tool.calls == [ORDER]
    assert result.redemption is not None and not result.redemption.recovered
    assert proxy.forwarded["POST /v1/permits/redeem"] == 1


def test_redeem_with_unknown_state_does_not_run(live: Live, proxy: FaultProxy) -> None:
    proxy.plan["POST /v1/permits/redeem"] = ["lose"]
    proxy.plan["GET /v1/permits/"] = ["503"] * 10
    tool = Tool()
    with gate(proxy.url, live.runtime) as g:
        result = g.call("get_order", ORDER, tool)
    assert result.status == "redeem_refused" and tool.calls == []
    assert result.code == "unavailable"


def test_server_error_mid_poll_keeps_waiting_and_never_runs(live: Live,
                                                           proxy: FaultProxy) -> None:
    proxy.plan["GET /v1/approvals/"] = ["503"] * 50
    tool = Tool()
    with gate(proxy.url, live.runtime) as g:
        result = g.call("issue_refund", REFUND, tool, approval_timeout=1.0)
    assert result.status == "approval_timeout" and tool.calls == []


def test_offline_permit_verification_with_jwks(live: Live) -> None:
    from cosigner_client import GateError
    from cosigner_client.jwks import PermitVerifier

    with gate(live.url, live.runtime) as g:
        decision = g.decide("get_order", ORDER)
    assert decision.permit is not None
    verifier = PermitVerifier(httpx.get(f"{live.url}/.well-known/jwks.json").json())
    claims = verifier.verify(decision.permit.token, tool="get_order", args=ORDER,
                             tenant=live.tenant)
    assert claims["jti"] == decision.permit.jti
    for kwargs, code in [({"tool": "get_order", "args": {"order_id": "ord_1"}}, "args_mismatch"),
                         ({"tool": "issue_refund", "args": ORDER}, "tool_mismatch"),
                         ({"tool": "get_order", "args": ORDER, "now": claims["exp"]},
                          "expired")]:
        with pytest.raises(GateError) as info:
            verifier.verify(decision.permit.token, **kwargs)
        assert info.value.code == code
    head, payload, sig = decision.permit.token.split(".")
    with pytest.raises(GateError) as info:
        verifier.verify(f"{head}.{payload}.{sig[:-4]}AAAA", tool="get_order", args=ORDER)
    assert info.value.code == "bad_signature"
