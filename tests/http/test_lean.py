"""The lean hot routes (cosigner.http.lean, issue 20): they are the ones serving
``POST /v1/decisions`` and ``POST /v1/permits/redeem``, and they answer exactly what the
FastAPI routes (kept for OpenAPI and as the fallback) answer — statuses, problem codes,
headers and bodies — for allows, refusals and every body fault."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from cosigner.http.edge import CosignerAPI
from cosigner.http.lean import HotRoutes
from tests.conftest import Harness, decision_request

VOLATILE = {"decision_id", "permit", "jti", "token", "decided_at", "expires_at", "id",
            "redeemed_at", "request_id", "approval", "trace_id", "iat", "exp", "nbf"}


def hot_routes(app: FastAPI) -> HotRoutes:
    """The HotRoutes instance inside the app's middleware stack (built here if need be)."""
    if app.middleware_stack is None:
        app.middleware_stack = app.build_middleware_stack()
    layer: Any = app.middleware_stack
    while layer is not None and not isinstance(layer, HotRoutes):
        layer = getattr(layer, "app", None)
    assert isinstance(layer, HotRoutes), "HotRoutes is not in the middleware stack"
    return layer


def lean_served(app: FastAPI) -> int:
    """How many requests the lean path answered: at the edge (cosigner.http.edge) or,
    where the edge leaves them to the stack, by its HotRoutes layer."""
    assert isinstance(app, CosignerAPI) and app.edge is not None
    return app.edge.served + hot_routes(app).served


def without_lean(app: FastAPI) -> FastAPI:
    """``app`` without the edge and with the lean middleware removed before its stack is
    built: every request goes to the FastAPI routes."""
    assert app.middleware_stack is None and isinstance(app, CosignerAPI)
    app.edge = None
    app.user_middleware = [m for m in app.user_middleware if m.cls is not HotRoutes]
    return app


def stable(value: Any) -> Any:
    """A JSON answer without per-request values (ids, tokens, times)."""
    if isinstance(value, dict):
        return {k: ("<volatile>" if k in VOLATILE else stable(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def shape(resp: httpx.Response) -> tuple[int, str | None, str | None, str | None, Any]:
    body = resp.json() if resp.content else None
    return (resp.status_code, resp.headers.get("content-type"),
            resp.headers.get("www-authenticate"), resp.headers.get("retry-after"),
            stable(body))


def cases(runtime: dict[str, str], admin: dict[str, str]
          ) -> list[tuple[str, dict[str, str], bytes]]:
    """(path, headers, raw body) of allows, refusals and body faults."""
    def body(**overrides: Any) -> bytes:
        return json.dumps(decision_request(request_id="req-fixed", **overrides)).encode()

    big = json.dumps(decision_request(context={"pad": "x" * 300_000})).encode()
    return [
        ("/v1/decisions", runtime, body()),
        ("/v1/decisions", runtime, body(args={"order_id": "ord_1", "amount_minor": 900_000,
                                              "currency": "USD",
                                              "reason_code": "duplicate_charge"})),
        ("/v1/decisions", runtime, body(args={"amount_minor": "x"})),
        ("/v1/decisions", runtime, b'{"request_id": "a", "request_id": "b"}'),
        ("/v1/decisions", runtime, b'{"x": NaN}'),
        ("/v1/decisions", runtime, b'{"x": 9007199254740993}'),
        ("/v1/decisions", runtime, b'{"x": '),
        ("/v1/decisions", runtime, b"\xff\xfe"),
        ("/v1/decisions", runtime, body(unexpected=1)),
        ("/v1/decisions", runtime, big),
        ("/v1/decisions", admin, body()),
        ("/v1/decisions", {}, body()),
        ("/v1/decisions", {"Authorization": "Bearer csk_nope_nope"}, body()),
        ("/v1/permits/redeem", runtime, b'{"permit": "a.b.c", "tool": "issue_refund",'
                                        b' "args": {}}'),
        ("/v1/permits/redeem", runtime, b'{"permit": "a.b.c"}'),
        ("/v1/permits/redeem", runtime, b'{"permit": 1, "permit": 2}'),
        ("/v1/permits/redeem", admin, b'{"permit": "a.b.c", "tool": "t", "args": {}}'),
        ("/v1/permits/redeem", {}, b"{}"),
    ]


async def test_lean_path_serves_the_hot_routes(harness: Harness, tenant: str) -> None:
    runtime = await harness.headers(tenant, "runtime")
    resp = await harness.client.post("/v1/decisions", json=decision_request(),
                                     headers=runtime)
    assert resp.status_code == 200 and resp.json()["effect"] == "allow"
    assert lean_served(harness.app) == 1
    token = resp.json()["permit"]["token"]
    args = decision_request()["args"]
    resp = await harness.client.post("/v1/permits/redeem", headers=runtime, json={
        "permit": token, "tool": "issue_refund", "args": args})
    assert resp.status_code == 200, resp.text
    assert lean_served(harness.app) == 2
    # Other routes (and other methods on these paths) still go to FastAPI.
    assert (await harness.client.get("/v1/tools", headers=runtime)).status_code == 200
    assert (await harness.client.get("/v1/decisions", headers=runtime)).status_code == 405
    assert lean_served(harness.app) == 2


@pytest.mark.parametrize("index", range(18))
async def test_lean_answers_as_the_fastapi_routes(harness_factory: Any, tenant: str,
                                                  index: int) -> None:
    lean = await harness_factory()
    plain = await harness_factory()
    without_lean(plain.app)
    answers = []
    for h in (lean, plain):
        runtime = await h.headers(tenant, "runtime")
        admin = await h.headers(tenant, "admin")
        path, headers, raw = cases(runtime, admin)[index]
        answers.append(shape(await h.client.post(
            path, content=raw, headers={**headers, "Content-Type": "application/json"})))
    assert answers[0] == answers[1]
    assert lean_served(lean.app) == 1
    assert not any(isinstance(m, HotRoutes) for m in _stack(plain.app))


def _stack(app: FastAPI) -> list[Any]:
    layers, layer = [], app.middleware_stack
    while layer is not None:
        layers.append(layer)
        layer = getattr(layer, "app", None)
    return layers
