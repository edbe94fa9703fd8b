"""Review probes of the edge (cosigner.http.edge, session 6): a send that fails after the
response started, the rate-limit door and the route reading different Authorization
headers, and tenants mixed in one connection's headers. Each probe runs the same request
through the edge and through the middleware stack (edge off) and compares."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from cosigner.core import logs
from cosigner.core.settings import RateLimits
from tests.conftest import Harness, decision_request
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


async def test_door_and_route_headers_never_let_a_request_go_uncounted(
        harness_factory: Any, tenant: str) -> None:
    """A first Authorization header the door cannot use (unknown key, Basic) and the
    caller's key last: the route authenticates the last and counts it, so the burst
    limit still holds (no bypass by a leading decoy header)."""
    limits = {"*": RateLimits(credential_burst=3, credential_per_s=0, tenant_burst=0,
                              tenant_per_s=0, decisions_per_min=0, approvals_per_min=0)}
    for h in await pair(harness_factory, rate_limits=limits):
        runtime = await h.headers(tenant, "runtime")
        # warm the key cache as a real client would
        first = await h.client.post("/v1/decisions", headers=runtime,
                                    json=decision_request())
        statuses = [first.status_code]
        for decoy in ("Bearer csk_nope_nope", "Basic abc", "Bearer "):
            resp = await h.client.post(
                "/v1/decisions", json=decision_request(),
                headers=[("Authorization", decoy), ("Authorization", runtime["Authorization"])])
            statuses.append(resp.status_code)
        # the burst of 3 per second: the fourth request within the second is refused
        # (pair() stops the windows' clock, so the four fall in one second on any machine)
        assert statuses[:3] == [200, 200, 200] and statuses[3] == 429, statuses


async def test_two_tenants_keys_in_one_request_act_as_the_stack(
        harness_factory: Any, tenant: str) -> None:
    """Keys of tenants A (first header) and B (last): the edge picks the same caller as
    the stack did (the door's cached first key; else the route's last key) — both keys
    are the sender's own, so no identity is gained; recorded for the report."""
    answers = []
    for h in await pair(harness_factory):
        a = await h.headers(tenant, "runtime")
        b = await h.headers(tenant + "-other", "runtime")
        out = []
        for warm in (False, True):
            if warm:  # both keys in the door's cache
                for key in (a, b):
                    await h.client.post("/v1/decisions", headers=key, json=decision_request())
            resp = await h.client.post(
                "/v1/decisions", json=decision_request(),
                headers=[("Authorization", a["Authorization"]),
                         ("Authorization", b["Authorization"])])
            decision = resp.json()["decision_id"]
            read = await h.client.get(f"/v1/decisions/{decision}", headers=a)
            out.append((resp.status_code, read.status_code))
        answers.append(out)
    assert answers[0] == answers[1], answers
