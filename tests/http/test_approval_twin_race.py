"""Insert-first ``open_request``: a pending twin that another transaction moves out of
``pending`` while a new identical decision waits for its row lock opens a new request.

On PostgreSQL the decision's ``INSERT ... ON CONFLICT DO NOTHING`` conflicts with the
committed pending twin without waiting (the twin is only *locked*, not yet updated, by a
review / the expiry sweep / a decision batch on another replica), then its
``SELECT ... FOR UPDATE`` blocks on that lock. When the other transaction commits the twin as
approved / rejected / expired, the re-checked row no longer matches ``status = 'pending'``,
and the read's snapshot predates any new twin, so it returns nothing: ``open_request``
would raise ``Conflict approval_race`` (409); instead it inserts again, as a new statement
that sees the twin gone, and opens a new request.

SQLite has one writer, so the interleaving cannot happen there (the test is skipped).
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from tests.conftest import Harness
from tests.http.approval_helpers import FINANCE, decide, scripted, write_scripted_bundle

NEEDS = {"effect": "require_approval", "reasons": ["scripted"], "approval": FINANCE}


def _dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def _wait_for_lock_wait(admin: asyncpg.Connection, timeout_s: float = 10) -> None:
    """Until some backend waits on a row lock (the decision's ``SELECT ... FOR UPDATE``)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        waiting = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'")
        if waiting:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the decision never waited on the twin's row lock")


async def test_decision_racing_a_review_of_its_pending_twin_opens_a_new_request(
        harness_factory, tmp_path, tenant: str, db_kind: str, database_url: str) -> None:
    if db_kind != "postgres":
        pytest.skip("needs PostgreSQL row locks (SQLite has one writer)")
    h: Harness = await harness_factory(bundle_dirs=[write_scripted_bundle(tmp_path)])
    rt = await h.headers(tenant, "runtime", subject="rt-1")
    run = "run-twin"
    body = scripted(NEEDS, run=run)
    first = await decide(h, rt, body)
    assert first["effect"] == "require_approval"
    twin_id = first["approval"]["id"]

    holder = await asyncpg.connect(_dsn(database_url))
    admin = await asyncpg.connect(_dsn(database_url))
    try:
        # Another transaction (a review, the expiry sweep, another replica's batch) holds
        # the twin's row lock and is about to move it out of 'pending'.
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT id FROM approvals WHERE id = $1 FOR UPDATE", twin_id)
        retry = h.client.post("/v1/decisions", headers=rt,
                              json={**body, "request_id": body["request_id"] + "-again"})
        pending = asyncio.ensure_future(retry)
        await _wait_for_lock_wait(admin)
        await holder.execute("UPDATE approvals SET status = 'rejected', decided_at = now() "
                             "WHERE id = $1", twin_id)
        await tx.commit()
        resp = await asyncio.wait_for(pending, 30)
    finally:
        await holder.close()
        await admin.close()
    # The twin is no longer pending, so the identical call opens a new request.
    assert resp.status_code == 200, resp.text
    again = resp.json()
    assert again["effect"] == "require_approval"
    assert again["approval"]["id"] != twin_id
