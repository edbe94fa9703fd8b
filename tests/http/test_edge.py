"""The edge (cosigner.http.edge, issue 20) answers the hot routes as the middleware stack it
stands in for (TrustedProxies → RateLimit → RequestTelemetry → HotRoutes inside
Starlette's error middleware): one script of requests — allows, approvals and their
long-poll reads, redeems, body faults, bad keys, request ids given or not, a 429 at the
door, an error in the route and one outside it — sent to an app with its edge and to one
whose edge is off gets the same statuses, headers in the same order, bodies and log lines
(logger, level, message, request id, tenant and decision id set or not)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cosigner.core import logs
from cosigner.core.settings import RateLimits
from cosigner.http import lean
from cosigner.http.edge import CosignerAPI
from tests.conftest import Harness, decision_request
from tests.http.approval_helpers import refund_args
from tests.http.test_lean import lean_served
from tests.http.test_lean_long_poll import _stable

_UUID4_HEX = re.compile(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}")
_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop
        return None


class Lines(logging.Handler):
    """Log lines of the ``cosigner`` loggers with the request context they were written
    in; the access line without its duration."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[Any, ...]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = _ID.sub("<id>", record.getMessage())
        if record.name == "cosigner.access":
            message = message.rsplit(" ", 1)[0]
        self.lines.append((record.name, record.levelname, message, logs.request_id.get(),
                           logs.tenant.get() is not None, logs.decision_id.get() is not None,
                           _task()))

    def seen(self, given: str | None) -> list[tuple[Any, ...]]:
        """The lines so far (then forgotten), the request id as ``<given>`` or ``<new>``;
        only those written by the calling task (the in-process transport runs the app in
        it): the apps' background tasks (checkpoints, sweeps, the committer) share the
        database and log on their own schedule."""
        here = _task()
        seen = [(*line[:3], "<given>" if line[3] == given else "<new>" if line[3] else None,
                 *line[4:6]) for line in self.lines if line[6] is here]
        self.lines.clear()
        return seen


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Iterator[Lines]:
    caplog.set_level(logging.INFO, logger="cosigner")
    handler = Lines()
    logging.getLogger("cosigner").addHandler(handler)
    yield handler
    logging.getLogger("cosigner").removeHandler(handler)


async def pair(harness_factory: Any, **settings: Any) -> tuple[Harness, Harness]:
    """Two apps on one database: with the edge, and with every request through the stack."""
    edge: Harness = await harness_factory(access_log=True, **settings)
    stack: Harness = await harness_factory(access_log=True, **settings)
    assert isinstance(stack.app, CosignerAPI)
    stack.app.edge = None
    for h in (edge, stack):  # one instant for both: the same counts and Retry-After
        h.pin_rate_windows()
    return edge, stack


def answer(resp: httpx.Response, given: str | None) -> tuple[Any, ...]:
    """The response as compared: a new request id must be a UUID4's hex digits."""
    headers = []
    for name, value in resp.headers.raw:
        if name == b"x-request-id" and given == value.decode():
            value = b"<given>"
        elif name == b"x-request-id":
            assert _UUID4_HEX.fullmatch(value.decode()), value
            value = b"<new>"
        headers.append((name, b"<n>" if name == b"content-length" else value))
    body = _stable(resp.json()) if resp.content else None  # volatile values out, in order
    return resp.status_code, headers, body


async def script(h: Harness, tenant: str, side: str, lines: Lines) -> list[Any]:
    """Every answer and the log lines written meanwhile; ``side`` keeps request ids apart
    (both apps write to one database)."""
    runtime = await h.headers(tenant, "runtime", subject="orchestrator")
    admin = await h.headers(tenant, "admin")
    out: list[Any] = []

    async def call(method: str, path: str, *, headers: Any = (), body: Any = None,
                   raw: bytes | None = None, client: httpx.AsyncClient | None = None
                   ) -> httpx.Response:
        headers = list(headers.items()) if isinstance(headers, dict) else list(headers)
        given = next((v for k, v in headers if k.lower() == "x-request-id"), None)
        content = raw if raw is not None else json.dumps(body).encode() if body else None
        lines.lines.clear()
        resp = await (client or h.client).request(
            method, path, headers=[*headers, ("content-type", "application/json")],
            content=content)
        out.append((method, _ID.sub("<id>", path), answer(resp, given), lines.seen(given)))
        return resp

    allow = (await call("POST", "/v1/decisions", body=decision_request(request_id=f"a-{side}"),
                        headers={**runtime, "X-Request-ID": f"rid-{side}"})).json()
    await call("POST", "/v1/decisions", body=decision_request(), headers=runtime)
    for rid in ("bad id!", "x" * 65, ""):
        await call("POST", "/v1/decisions", body=decision_request(),
                   headers={**runtime, "X-Request-ID": rid})
    await call("POST", "/v1/decisions", body=decision_request(), headers=[
        *runtime.items(), ("X-Request-ID", f"one-{side}"), ("X-Request-ID", "two")])
    for raw in (b'{"x": ', b'{"a": 1, "a": 2}', json.dumps(
            decision_request(context={"pad": "x" * 300_000})).encode()):
        await call("POST", "/v1/decisions", raw=raw, headers=runtime)
    await call("POST", "/v1/decisions", body=decision_request(unexpected=1), headers=runtime)
    for headers in ({}, {"Authorization": "Bearer csk_nope_nope"}, admin,
                    [*runtime.items(), ("Authorization", "Basic abc")],
                    [("Authorization", "Basic abc"), *runtime.items()]):
        await call("POST", "/v1/decisions", body=decision_request(), headers=headers)
    opened = (await call("POST", "/v1/decisions", headers=runtime, body=decision_request(
        run={"id": f"run-{side}"}, args=refund_args()))).json()
    for query, headers in (("?wait=0", runtime), ("?wait=0.05", runtime), ("", {}),
                           ("", admin)):
        await call("GET", f"/v1/approvals/{opened['approval']['id']}{query}",
                   headers={**headers, "X-Request-ID": f"poll-{side}"})
    await call("GET", "/v1/approvals/unknown-approval", headers=runtime)
    twice = [*runtime.items(), *runtime.items()]  # refused (401) on every path
    await call("GET", f"/v1/approvals/{opened['approval']['id']}?wait=0", headers=twice)
    await call("POST", "/v1/permits/redeem", body={"permit": "a.b.c"}, headers=twice)
    redeem = {"permit": allow["permit"]["token"], "tool": "issue_refund",
              "args": decision_request()["args"]}
    for _ in range(2):
        await call("POST", "/v1/permits/redeem", body=redeem, headers=runtime)
    await call("POST", "/v1/permits/redeem", body={"permit": "a.b.c"}, headers=runtime)
    await call("GET", "/v1/tools", headers=runtime)  # not a hot route: the stack's
    await _failures(h, call, runtime)
    return out


async def _failures(h: Harness, call: Any, runtime: dict[str, str]) -> None:
    """An error in the route (a 500 with the request id) and in the door, outside the
    route (the error middleware's 500 without it; the error raised on to the server)."""
    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("boom")

    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(lean.HOT_ROUTES, "/v1/decisions", (broken, True))
        await call("POST", "/v1/decisions", body=decision_request(), headers=runtime)
    raising = httpx.AsyncClient(transport=httpx.ASGITransport(
        app=h.app, raise_app_exceptions=False), base_url="http://cosigner.test")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(h.context.quotas, "count", broken)
        async with raising:
            await call("POST", "/v1/decisions", body=decision_request(), headers=runtime,
                       client=raising)
    with pytest.raises(RuntimeError), pytest.MonkeyPatch.context() as patch:
        patch.setattr(h.context.quotas, "count", broken)
        await h.client.post("/v1/permits/redeem", headers=runtime, json={})


async def test_the_edge_answers_and_logs_as_the_stack(harness_factory: Any, tenant: str,
                                                      lines: Lines) -> None:
    edge, stack = await pair(harness_factory, forwarded_allow_ips=["127.0.0.1"])
    through_edge = await script(edge, tenant, "e", lines)
    through_stack = await script(stack, tenant, "s", lines)
    assert len(through_edge) == len(through_stack)
    for one, other in zip(through_edge, through_stack, strict=True):
        assert one == other
    assert lean_served(edge.app) >= 20
    assert isinstance(edge.app, CosignerAPI) and edge.app.edge is not None
    assert edge.app.edge.served == lean_served(edge.app)  # none left to the stack


async def test_a_429_at_the_door_is_the_stacks(harness_factory: Any, tenant: str,
                                               lines: Lines) -> None:
    limits = {"*": RateLimits(credential_burst=0, credential_per_s=0, tenant_burst=0,
                              tenant_per_s=0, decisions_per_min=2, approvals_per_min=0)}
    answers = []
    for h in await pair(harness_factory, rate_limits=limits):
        runtime = await h.headers(tenant, "runtime")
        await h.client.post("/v1/decisions", headers=runtime, json=decision_request())
        seen = []
        for _ in range(3):
            lines.lines.clear()
            resp = await h.client.post("/v1/decisions", headers=runtime,
                                       json=decision_request())
            seen.append((answer(resp, None), lines.seen(None)))
        answers.append(seen)
    assert answers[0] == answers[1]
    assert answers[0][-1][0][0] == 429
    assert (b"retry-after", b"60") in answers[0][-1][0][1]  # the pinned minute just began
    # The request id last, as every other answer has it (a new one: none was given).
    assert answers[0][-1][0][1][-1] == (b"x-request-id", b"<new>")


async def test_a_429_at_the_door_is_logged_like_an_answer(harness_factory: Any, tenant: str,
                                                          lines: Lines) -> None:
    """A request the rate-limit door refuses (429, before any route) writes its access
    line as an answered request does, in its log context (the caller's request id, the
    refused caller's tenant), through the edge and through the stack alike; its response
    carries that request id in ``X-Request-ID`` (a new one when none was given: the one
    its line is written under)."""
    limits = {"*": RateLimits(credential_burst=0, credential_per_s=0, tenant_burst=0,
                              tenant_per_s=0, decisions_per_min=1, approvals_per_min=0)}
    for h in await pair(harness_factory, rate_limits=limits):
        runtime = await h.headers(tenant, "runtime")
        first = await h.client.post("/v1/decisions", headers=runtime, json=decision_request())
        assert first.status_code == 200
        lines.lines.clear()
        resp = await h.client.post("/v1/decisions", headers={**runtime, "x-request-id": "r429"},
                                   json=decision_request())
        assert resp.status_code == 429 and resp.headers["x-request-id"] == "r429"
        assert ("cosigner.access", "INFO", "POST /v1/decisions 429", "<given>", True,
                False) in lines.seen("r429")
        fresh = await h.client.post("/v1/decisions", headers=runtime,
                                    json=decision_request())
        assert fresh.status_code == 429
        rid = fresh.headers["x-request-id"]
        assert _UUID4_HEX.fullmatch(rid), rid
        assert [line[3] for line in lines.lines if line[0] == "cosigner.access"
                and line[2] == "POST /v1/decisions 429"] == [rid]
        lines.lines.clear()
