"""Review probes of the edge (cosigner.http.edge, session 6): a send that fails after the
response started, and requests carrying more than one Authorization header (once read
differently by the rate-limit door and the routes; since session 8 refused, 401, on every
path). Each probe runs the same request through the edge and through the middleware stack
(edge off) and compares."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from cosigner.core import logs
from cosigner.core.clock import system_clock
from cosigner.core.settings import RateLimits
from cosigner.db.database import Database
from cosigner.identity.principals import create_api_key
from tests.conftest import Harness, decision_request
from tests.http.approval_helpers import refund_args
from tests.http.test_edge import pair


def _scope(path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "client": ("10.0.0.9", 5555),
            "server": ("cosigner.test", 80),
            "headers": [(b"host", b"cosigner.test"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()), *headers]}


async def _send_fails_on_body(h: Harness, runtime: dict[str, str], side: str
                              ) -> tuple[list[Any], str, list[str]]:
    body = json.dumps(decision_request(request_id=f"broken-pipe-{side}")).encode()
    scope = _scope("/v1/decisions", [(b"authorization", runtime["Authorization"].encode()),
                                     (b"x-request-id", f"rid-{side}".encode())], body)
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["type"] if message["type"] != "http.response.start"
                    else (message["type"], message["status"]))
        if message["type"] == "http.response.body":
            raise OSError("broken pipe")

    access: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name == "cosigner.access":
                access.append(record.getMessage().rsplit(" ", 1)[0])

    grab = Grab(logging.INFO)
    logging.getLogger("cosigner").addHandler(grab)
    old_level = logging.getLogger("cosigner").level
    logging.getLogger("cosigner").setLevel(logging.INFO)
    try:
        with pytest.raises(OSError, match="broken pipe"):
            await h.app(scope, receive, send)
    finally:
        logging.getLogger("cosigner").removeHandler(grab)
        logging.getLogger("cosigner").setLevel(old_level)
    # the request's log context does not leak into what runs next on this task
    assert logs.request_id.get() is None and logs.tenant.get() is None
    return sent, str(logs.decision_id.get()), access


async def test_a_send_failing_after_the_start_is_raised_once_as_by_the_stack(
        harness_factory: Any, tenant: str) -> None:
    seen = []
    for side, h in zip("es", await pair(harness_factory), strict=True):
        runtime = await h.headers(tenant, "runtime")
        seen.append(await _send_fails_on_body(h, runtime, side))
    edge, stack = seen
    # one start (200), one body, no second start (no 500 after the response started)
    assert edge[0] == [("http.response.start", 200), "http.response.body"]
    assert edge == stack
    assert edge[2] == ["POST /v1/decisions 200"]


def _several(*keys: dict[str, str]) -> list[tuple[str, str]]:
    return [("Authorization", key["Authorization"]) for key in keys]


async def _refusals(h: Harness, runtime: dict[str, str], other: dict[str, str],
                    approval: str) -> list[Any]:
    """Every path of the API with two Authorization headers (the caller's key twice, a
    decoy and the key in both orders, keys of two tenants): the answers as compared."""
    decoys = [("Bearer csk_nope_nope", runtime["Authorization"]),
              (runtime["Authorization"], "Basic abc"), (runtime["Authorization"],) * 2,
              (runtime["Authorization"], other["Authorization"]), ("Bearer ", "Bearer ")]
    seen = []
    for first, last in decoys:
        headers = [("Authorization", first), ("Authorization", last)]
        for method, path, body in (
                ("POST", "/v1/decisions", decision_request()),
                ("POST", "/v1/permits/redeem", {"permit": "a.b.c", "tool": "t", "args": {}}),
                ("GET", f"/v1/approvals/{approval}?wait=0.05", None),
                ("GET", f"/v1/approvals/{approval}", None),
                ("GET", "/v1/approvals", None),  # FastAPI routes
                ("POST", f"/v1/approvals/{approval}/cancel", {}),
                ("GET", "/v1/tools", None)):
            resp = await h.client.request(method, path, headers=headers, json=body)
            seen.append((method, path, resp.status_code, resp.headers.get("www-authenticate"),
                         resp.json()["code"], resp.json()["detail"]))
    return seen


async def test_several_authorization_headers_are_refused_on_every_path(
        harness_factory: Any, tenant: str) -> None:
    """More than one Authorization header: 401 ``unauthenticated`` on every path, through
    the edge and through the stack alike — never one header read at the door and another
    at the route — and nothing counted: the credential's burst is intact afterwards."""
    limits = {"*": RateLimits(credential_burst=3, credential_per_s=0, tenant_burst=0,
                              tenant_per_s=0, decisions_per_min=0, approvals_per_min=0)}
    answers = []
    for h in await pair(harness_factory, rate_limits=limits):
        runtime = await h.headers(tenant, "runtime")
        other = await h.headers(tenant + "-other", "runtime")
        # warm the door's key cache for both keys (one count each)
        opened = await h.client.post("/v1/decisions", headers=runtime, json=decision_request(
            run={"id": "run-two-headers"}, args=refund_args()))
        await h.client.post("/v1/decisions", headers=other, json=decision_request())
        assert opened.status_code == 200, opened.text
        seen = await _refusals(h, runtime, other, opened.json()["approval"]["id"])
        assert {row[2:] for row in seen} == {
            (401, 'Bearer realm="cosigner"', "unauthenticated",
             "more than one Authorization header")}, seen
        # 35 refusals counted nowhere: two more requests fit in the burst of 3, the third not
        statuses = [(await h.client.post("/v1/decisions", headers=runtime,
                                         json=decision_request())).status_code
                    for _ in range(3)]
        assert statuses == [200, 200, 429], statuses
        answers.append(seen)
    assert answers[0] == answers[1]


async def test_several_authorization_headers_are_refused_before_the_body_is_read(
        harness_factory: Any, tenant: str) -> None:
    """The 401 comes before any work: the request's body is never received."""
    for side, h in zip("es", await pair(harness_factory), strict=True):
        runtime = await h.headers(tenant, "runtime")
        await h.client.post("/v1/decisions", headers=runtime, json=decision_request())
        key = runtime["Authorization"].encode()
        scope = _scope("/v1/decisions", [(b"authorization", key), (b"authorization", key),
                                         (b"x-request-id", f"two-{side}".encode())], b"{}")
        sent: list[Any] = []

        async def receive() -> dict[str, Any]:
            raise AssertionError("the body was read")

        async def send(message: dict[str, Any], sent: list[Any] = sent) -> None:
            sent.append(message)

        await h.app(scope, receive, send)
        assert sent[0]["status"] == 401
        assert (b"x-request-id", f"two-{side}".encode()) in sent[0]["headers"]
        assert json.loads(sent[1]["body"])["code"] == "unauthenticated"


async def test_several_authorization_headers_are_refused_over_http(
        live_server_factory: Any, database_url: str, tenant: str) -> None:
    """The same over real HTTP on loopback (``cosigner serve``: the server hands both
    headers on), including ``GET /metrics`` with its token twice."""
    server = live_server_factory(COSIGNER_METRICS_TOKEN="m" * 32)
    db = Database(database_url)
    try:
        key, _ = await create_api_key(db, tenant=tenant, roles=["runtime"],
                                      subject="two-headers", clock=system_clock)
    finally:
        await db.dispose()
    runtime = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        ok = await client.post("/v1/decisions", headers=runtime, json=decision_request())
        assert ok.status_code == 200, ok.text
        statuses = set()
        for method, path, body, value in (
                ("POST", "/v1/decisions", decision_request(), runtime["Authorization"]),
                ("POST", "/v1/permits/redeem", {"permit": "a.b.c"}, runtime["Authorization"]),
                ("GET", "/v1/approvals/some-id?wait=1", None, runtime["Authorization"]),
                ("GET", "/v1/approvals", None, runtime["Authorization"]),
                ("GET", "/metrics", None, "Bearer " + "m" * 32)):
            resp = await client.request(method, path, json=body, headers=[
                ("Authorization", value), ("Authorization", value)])
            statuses.add((resp.status_code, resp.json()["code"], resp.json()["detail"]))
        assert statuses == {(401, "unauthenticated", "more than one Authorization header")}
        metrics = await client.get("/metrics", headers={"Authorization": "Bearer " + "m" * 32})
        assert metrics.status_code == 200
