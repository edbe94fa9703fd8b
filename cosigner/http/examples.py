"""Request and response examples of the OpenAPI document, taken from the README's curl
bodies (tests/http/test_openapi_clients.py fails when a README body is missing here)."""

from __future__ import annotations

from typing import Any

_REFUND_ARGS = {"order_id": "ord_8472", "amount_minor": 5000, "currency": "USD",
                "reason_code": "duplicate_charge"}

#: route function name → named request body examples.
REQUESTS: dict[str, dict[str, Any]] = {
    "post_decision": {"refund": {
        "request_id": "readme-1",
        "run": {"id": "run-8472", "step": 1},
        "principal": {"id": "customer-42", "type": "customer"},
        "initiator": {"id": "support-agent", "type": "agent"},
        "tool": {"name": "issue_refund", "side_effect": "financial"},
        "args": _REFUND_ARGS},
        "refund_for_approval": {
            "request_id": "approve-demo-1",
            "run": {"id": "run-8472", "step": 1},
            "principal": {"id": "customer-42", "type": "customer"},
            "initiator": {"id": "support-agent", "type": "agent"},
            "tool": {"name": "issue_refund", "side_effect": "financial"},
            "args": {**_REFUND_ARGS, "amount_minor": 150000}}},
    "post_review": {
        "approve": {"decision": "approved", "comment": "double charge confirmed"},
        "reject": {"decision": "rejected", "comment": "not a double charge"},
        "approve_with_standing": {
            "decision": "approved", "comment": "ok for this order",
            "standing": {"scope": "run", "max_uses": 3, "constraints": [
                {"pointer": "/order_id", "op": "equals", "value": "ord_8472"},
                {"pointer": "/amount_minor", "op": "max", "value": 200000}]}}},
    "post_break_glass": {
        "outage": {"reason": "payment processor outage, refunds must go out now"}},
    "post_withdraw_rejection": {"withdraw": {"reason": "customer sent the bank statement"}},
    "post_redeem": {"redeem": {"permit": "eyJhbGciOiJFZDI1NTE5Iiwia2lkIjoi...",
                               "tool": "issue_refund", "args": _REFUND_ARGS}},
    "post_run": {"contract": {"run_id": "run-contract-1",
                              "allowed_tools": ["get_order", "issue_refund"],
                              "budget": {"max_tool_calls": 10, "max_cost": 500000},
                              "cost_args": {"issue_refund": "/amount_minor"}}},
    "post_outcome": {"ok": {"outcome": "ok", "side_effect": "committed", "cost_minor": 5000}},
}

#: route function name → (status, named response examples).
RESPONSES: dict[str, tuple[int, dict[str, Any]]] = {
    "post_decision": (200, {"allow": {
        "decision_id": "0193f1c2-5b7e-7c3a-9d41-6f0e2a1b8c55",
        "request_id": "readme-1",
        "effect": "allow",
        "reasons": [{"code": "within_limit", "message": "refund within the agent's limit"}],
        "policy": {"id": "refunds", "version": "1.0.0",
                   "revision": "sha256:4f1c0e9b7d2a6c3e8b5f0a1d9c7e2b4a"},
        "args_hash": "sha256:9a4e6f2c1b8d7e3f0a5c6b9d2e1f4a7c",
        "permit": {"token": "eyJhbGciOiJFZDI1NTE5Iiwia2lkIjoi...",
                   "jti": "0193f1c2-5b7f-7d10-a2c3-1e9b4f6d8a20",
                   "expires_at": "2026-12-01T12:05:00+00:00"}}}),
}

#: route function name → (status, named problem examples).
PROBLEMS: dict[str, tuple[int, dict[str, Any]]] = {
    "post_decision": (422, {"duplicate_key": {
        "type": "https://cosigner.dev/problems/duplicate_key",
        "title": "Request body is not acceptable JSON", "status": 422,
        "detail": "duplicate object key 'request_id'", "code": "duplicate_key"}}),
}
