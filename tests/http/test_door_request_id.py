"""The rate-limit door's 429 carries ``X-Request-ID`` like every other answer (session 15).

A request past a rate limit at the door (a key this process has seen: counted before any
route, :mod:`cosigner.http.ratelimit`) is answered 429 ``rate_limited`` there, ahead of
the request telemetry that gives every other answer its request id. It now carries one
too: the caller's ``X-Request-ID`` when it is short and plain, else a new one — the id its
access line is written under, so a client quoting the header finds the server's line.
Over real HTTP on loopback (``cosigner serve``), for a hot route (the edge,
:mod:`cosigner.http.edge`) and a framework route (the stack's ``RateLimit``).
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

from cosigner.core.clock import system_clock
from cosigner.db.database import Database
from cosigner.identity.principals import create_api_key
from tests.conftest import decision_request

_FRESH = re.compile(r"[0-9a-f]{32}")
#: One request per second per credential: two in the same second, the second is refused.
LIMITS = {"*": {"credential_burst": 1, "credential_per_s": 0, "tenant_burst": 0,
                "tenant_per_s": 0, "decisions_per_min": 0, "approvals_per_min": 0}}


def _access_lines(log: str) -> list[dict[str, Any]]:
    lines = []
    for text in log.splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if line.get("logger") == "cosigner.access":
            lines.append(line)
    return lines


async def test_a_429_at_the_door_carries_the_request_id_it_is_logged_under(
        live_server_factory: Any, database_url: str, tenant: str) -> None:
    server = live_server_factory(COSIGNER_RATE_LIMITS=json.dumps(LIMITS),
                                 COSIGNER_ACCESS_LOG="true", COSIGNER_LOG_LEVEL="info")
    db = Database(database_url)
    try:
        key, _ = await create_api_key(db, tenant=tenant, roles=["runtime"],
                                      subject="door-429", clock=system_clock)
    finally:
        await db.dispose()
    runtime = {"Authorization": f"Bearer {key}"}
    refused: dict[str, list[tuple[str | None, httpx.Response]]] = {"edge": [], "stack": []}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        first = await client.post("/v1/decisions", headers=runtime, json=decision_request())
        assert first.status_code in (200, 429), first.text  # the key is now in the cache
        for attempt in range(40):
            if all(len(answers) >= 2 for answers in refused.values()):
                break
            # Given and plain, given but not plain (replaced), or none (a new one).
            given = (f"door-{attempt}", "not plain!", None)[attempt % 3]
            headers = {**runtime, **({"X-Request-ID": given} if given else {})}
            for where, send in (
                    ("edge", lambda h: client.post("/v1/decisions", headers=h,
                                                   json=decision_request())),
                    ("stack", lambda h: client.get("/v1/approvals", headers=h))):
                resp = await send(headers)
                if resp.status_code == 429:
                    refused[where].append((given, resp))
    assert all(len(answers) >= 2 for answers in refused.values()), refused
    sent: list[tuple[str, str]] = []
    for where, answers in refused.items():
        for given, resp in answers:
            assert resp.json()["code"] == "rate_limited", resp.text
            assert resp.headers["content-type"] == "application/problem+json"
            rid = resp.headers.get("x-request-id")
            assert rid is not None, (where, resp.headers)
            if given is not None and given.startswith("door-"):
                assert rid == given
            else:
                assert _FRESH.fullmatch(rid), rid
            sent.append((where, rid))
    # Each refusal's access line is written under the id its answer carries.
    logged = {(line["message"].split(" ")[1], line.get("request_id"))
              for line in _access_lines(server.log_tail(2_000_000))
              if " 429 " in line["message"]}
    for where, rid in sent:
        path = "/v1/decisions" if where == "edge" else "/v1/approvals"
        assert (path, rid) in logged, (where, rid, sorted(logged))
