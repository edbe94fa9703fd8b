"""``distinct_from: previous`` counts every approval a person gave in the run (session 15).

DESIGN invariant 6: with ``previous`` an approver differs from every approver already
accepted in this run. The reading pinned here is the conservative one: an approval given
on another request of the run counts whatever that request became — approved, or ended
without effect (expired, cancelled, rejected by someone else) — so a request ending never
frees its approvers for the run's other calls, nor for the same call asked again.

The one approval that does not count is one voided by superseding
(:mod:`cosigner.approvals.superseding`), and only toward the requests of the *same call*
(tenant, run, tool, args hash): the request that replaced it asks for exactly the call the
person approved, under stricter rules, and its approvers review it again. Toward the run's
other calls a voided approval counts like any other. The review (JSON API) and the
approver's queue (``GET /v1/approvals``, the web inbox) apply the same rule.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from cosigner.core.clock import FrozenClock
from tests.conftest import Harness
from tests.http.approval_helpers import decide, needs, review, scripted, scripted_harness
from tests.web.conftest import add_user, sign_in, web_client

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
RUN = "run-sod"


class People:
    """A runtime, and finance approvers carol, dave and erin (carol with a web account
    too, for her inbox)."""

    def __init__(self, h: Harness, tenant: str) -> None:
        self.h, self.tenant = h, tenant
        self.runtime: dict[str, str] = {}
        self.fin: dict[str, dict[str, str]] = {}

    async def make(self) -> People:
        await add_user(self.h.db, self.tenant, "carol", "finance")
        self.runtime = await self.h.headers(self.tenant, "runtime")
        self.fin = {s: await self.h.headers(self.tenant, "finance", subject=s)
                    for s in ("carol", "dave", "erin")}
        return self

    async def open(self, path: str, result: dict[str, Any], request_id: str | None = None
                   ) -> str:
        body = scripted(result, run=RUN, args={"path": path})
        if request_id is not None:
            body["request_id"] = request_id
        decided = await decide(self.h, self.runtime, body)
        assert decided["effect"] == "require_approval", decided
        return str(decided["approval"]["id"])

    async def queued_for_carol(self, approval_id: str) -> tuple[bool, bool]:
        """Whether ``approval_id`` is in carol's queue: the JSON API's, the web inbox's."""
        listed = await self.h.client.get("/v1/approvals", headers=self.fin["carol"],
                                         params={"status": "pending"})
        assert listed.status_code == 200, listed.text
        in_api = approval_id in {item["id"] for item in listed.json()["items"]}
        async with web_client(self.h) as client:
            await sign_in(client, self.tenant, "carol")
            inbox = await client.get("/ui")
        assert inbox.status_code == 200
        return in_api, approval_id in inbox.text


def _refused(resp: httpx.Response) -> tuple[int, str]:
    return resp.status_code, resp.json().get("code", "")


@pytest.fixture
async def clocked(harness_factory: Callable[..., Any], tmp_path: Path
                  ) -> tuple[Harness, FrozenClock]:
    clock = FrozenClock(T0)
    return await scripted_harness(harness_factory, tmp_path, clock=clock), clock


async def _end(p: People, clock: FrozenClock, approval_id: str, end: str) -> None:
    """End request ``approval_id`` (carol approved it, 1 of 2) as ``end`` says."""
    if end == "expired":
        clock.advance(seconds=601)
        read = await p.h.client.get(f"/v1/approvals/{approval_id}", headers=p.runtime)
        assert read.json()["status"] == "expired", read.text
    elif end == "cancelled":
        resp = await p.h.client.post(f"/v1/approvals/{approval_id}/cancel",
                                     headers=p.runtime)
        assert resp.json()["status"] == "cancelled", resp.text
    elif end == "rejected":
        resp = await review(p.h, p.fin["dave"], approval_id, decision="rejected",
                            comment="not this one")
        assert resp.json()["status"] == "rejected", resp.text
    else:  # approved
        resp = await review(p.h, p.fin["erin"], approval_id)
        assert resp.json()["status"] == "approved", resp.text


@pytest.mark.parametrize("end", ["approved", "expired", "cancelled", "rejected"])
async def test_an_approval_counts_in_the_run_however_its_request_ended(
        clocked: tuple[Harness, FrozenClock], tenant: str, end: str) -> None:
    h, clock = clocked
    p = await People(h, tenant).make()
    first = await p.open("/tmp/x", needs(("finance", 2), distinct_from="previous"))
    assert (await review(h, p.fin["carol"], first)).status_code == 200
    await _end(p, clock, first, end)
    other = await p.open("/tmp/y", needs(("finance", 1), distinct_from="previous"))
    assert _refused(await review(h, p.fin["carol"], other)) == (403, "previous_approver")
    assert await p.queued_for_carol(other) == (False, False)
    approver = "dave" if end != "rejected" else "erin"  # a rejection is no approval
    done = await review(h, p.fin[approver], other)
    assert done.status_code == 200 and done.json()["status"] == "approved", done.text


@pytest.mark.parametrize("end", ["expired", "cancelled"])
async def test_the_same_call_asked_again_after_its_request_ended_needs_someone_else(
        clocked: tuple[Harness, FrozenClock], tenant: str, end: str) -> None:
    """A request that ended is no replacement: the call asked again is a new request,
    and the approval given on the old one counts as a previous approval in the run."""
    h, clock = clocked
    p = await People(h, tenant).make()
    result = needs(("finance", 2), distinct_from="previous")
    first = await p.open("/tmp/x", result)
    assert (await review(h, p.fin["carol"], first)).status_code == 200
    await _end(p, clock, first, end)
    again = await p.open("/tmp/x", result, request_id="asked-again")
    assert again != first
    assert _refused(await review(h, p.fin["carol"], again)) == (403, "previous_approver")
    assert await p.queued_for_carol(again) == (False, False)


async def test_a_voided_approval_counts_toward_the_runs_other_calls_not_its_own(
        clocked: tuple[Harness, FrozenClock], tenant: str) -> None:
    h, _ = clocked
    p = await People(h, tenant).make()
    twin = await p.open("/tmp/x", needs(("finance", 2), distinct_from="previous"))
    assert (await review(h, p.fin["carol"], twin)).status_code == 200
    # The policy now asks three: the twin is superseded and carol's approval voided.
    replacement = await p.open("/tmp/x", needs(("finance", 3), distinct_from="previous"),
                               request_id="stricter")
    assert replacement != twin
    other = await p.open("/tmp/y", needs(("finance", 1), distinct_from="previous"))
    # Another call of the run: carol already approved one (the voided approval counts).
    assert _refused(await review(h, p.fin["carol"], other)) == (403, "previous_approver")
    assert await p.queued_for_carol(other) == (False, False)
    # The call she approved, asked again under stricter rules: she reviews it again.
    assert await p.queued_for_carol(replacement) == (True, True)
    resp = await review(h, p.fin["carol"], replacement)
    assert resp.status_code == 200 and resp.json()["status"] == "pending", resp.text
    done = await review(h, p.fin["erin"], other)
    assert done.status_code == 200 and done.json()["status"] == "approved", done.text
