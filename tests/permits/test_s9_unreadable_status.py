"""GET /v1/permits/{jti} when the permit's redeem event does not read back (session 9).

``redeemed_by_you`` rests on the ``permit.redeemed`` event's actor: with that event
damaged (its row before deleted by hand, its frame damaged, its text garbled, or rewritten
by hand so that it no longer hashes to its row's hash) the answer fails closed: a 500
``audit_event_unreadable`` problem without internals, never a 200 that could tell a
client to execute (or tell the real redeemer that someone else consumed its permit)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cosigner.db import event_row
from tests.audit.damage import KINDS, damage, edit_actor, seqs, stored
from tests.conftest import Harness, decision_request
from tests.http.approval_helpers import redeem, refund_args


async def _redeemed(h: Harness, tenant: str, runtime: dict[str, str]) -> tuple[str, int]:
    """A permit redeemed by ``runtime`` after a few other decisions; its jti and the seq
    of its ``permit.redeemed`` event."""
    for _ in range(3):
        resp = await h.client.post("/v1/decisions", headers=runtime, json=decision_request())
        assert resp.status_code == 200, resp.text
    decision = (await h.client.post("/v1/decisions", headers=runtime,
                                    json=decision_request())).json()
    jti = decision["permit"]["jti"]
    resp = await redeem(h, runtime, decision["permit"]["token"], "issue_refund",
                        refund_args(5000))
    assert resp.status_code == 200, resp.text
    (seq,) = await seqs(h, tenant, "permit.redeemed", permit_jti=jti)
    return jti, seq


def _fails_closed(resp: Any) -> None:
    assert resp.status_code == 500, resp.text
    doc = resp.json()
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert doc["code"] == "audit_event_unreadable"
    assert doc["detail"] == event_row.EventUnreadable.DETAIL
    assert "redeemed_by_you" not in doc and "status" in doc and doc["status"] == 500
    text = json.dumps(doc)
    for internal in ("sha256", "zstd", "frame", "Traceback", "prune?"):
        assert internal not in text, internal


@pytest.mark.parametrize("kind", KINDS)
async def test_a_redeem_event_that_does_not_read_fails_closed(harness: Harness, tenant: str,
                                                              kind: str) -> None:
    runtime = await harness.headers(tenant, "runtime", subject="rt-a")
    jti, seq = await _redeemed(harness, tenant, runtime)
    resp = await harness.client.get(f"/v1/permits/{jti}", headers=runtime)
    assert resp.status_code == 200 and resp.json()["redeemed_by_you"] is True
    if kind == "row_before_deleted":
        assert (await stored(harness, tenant))[seq][0] in (4, 5, 6)
    await damage(harness, tenant, seq, kind)
    _fails_closed(await harness.client.get(f"/v1/permits/{jti}", headers=runtime))


async def test_a_redeem_event_rewritten_by_hand_grants_nobody(harness: Harness,
                                                              tenant: str) -> None:
    """The redeem event rewritten (valid JSON) to name another runtime as its actor: that
    runtime is not told the redeem was its own (it would execute the side effect); the
    rewritten text no longer hashes to its row's hash, so the answer fails closed."""
    runtime = await harness.headers(tenant, "runtime", subject="rt-a")
    other = await harness.headers(tenant, "runtime", subject="rt-b")
    jti, seq = await _redeemed(harness, tenant, runtime)
    resp = await harness.client.get(f"/v1/permits/{jti}", headers=other)
    assert resp.status_code == 200 and resp.json()["redeemed_by_you"] is False
    await edit_actor(harness, tenant, seq, "rt-b")
    _fails_closed(await harness.client.get(f"/v1/permits/{jti}", headers=other))
    _fails_closed(await harness.client.get(f"/v1/permits/{jti}", headers=runtime))


async def test_other_permits_are_not_affected(harness: Harness, tenant: str) -> None:
    """Damage to one permit's redeem event and to another's decision leaves an issued
    permit's state (which reads no event) answering as before."""
    runtime = await harness.headers(tenant, "runtime", subject="rt-a")
    _, seq = await _redeemed(harness, tenant, runtime)
    decision = (await harness.client.post("/v1/decisions", headers=runtime,
                                          json=decision_request())).json()
    await damage(harness, tenant, seq, "frame_damaged")
    made = await seqs(harness, tenant, "decision.made", decision_id=decision["decision_id"])
    await damage(harness, tenant, made[0], "frame_damaged")
    resp = await harness.client.get(f"/v1/permits/{decision['permit']['jti']}",
                                    headers=runtime)
    assert resp.status_code == 200, resp.text
    assert (resp.json()["status"], resp.json()["redeemed_by_you"]) == ("issued", False)
