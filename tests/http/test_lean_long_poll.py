"""The long-poll read ``GET /v1/approvals/{approval_id}?wait=s`` on the lean path
(cosigner.http.lean, issue 20): it is the one serving the reads the route accepts, and
every read — pending, approved with its permit, unknown, refused, malformed — is
answered exactly as by the FastAPI route (statuses, problem codes, headers, bodies and
their key order)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.conftest import Harness, decision_request
from tests.http.approval_helpers import decide, refund_args, review
from tests.http.test_lean import VOLATILE, lean_served, without_lean

#: (query, which key: "runtime" | "admin" | "none" | "bad", which id: "real" | literal)
READS: list[tuple[str, str, str]] = [
    ("", "runtime", "real"),
    ("?wait=0", "runtime", "real"),
    ("?wait=0.25", "runtime", "real"),
    ("?wait=0&other=1", "runtime", "real"),
    ("", "runtime", "unknown-approval"),
    ("", "admin", "real"),
    ("", "none", "real"),
    ("", "bad", "real"),
    ("?wait=61", "runtime", "real"),       # the rest goes on to FastAPI (its 422)
    ("?wait=-1", "runtime", "real"),
    ("?wait=abc", "runtime", "real"),
    ("?wait=1&wait=2", "runtime", "real"),
    ("", "runtime", "a" * 65),
    ("", "runtime", "bad.id"),
]
#: reads the lean path takes (the others fall through to FastAPI)
LEAN = 8


async def _answers(h: Harness, tenant: str) -> list[tuple[Any, ...]]:
    runtime = await h.headers(tenant, "runtime", subject="orchestrator")
    keys = {"runtime": runtime, "admin": await h.headers(tenant, "admin"), "none": {},
            "bad": {"Authorization": "Bearer csk_nope_nope"}}
    finance = await h.headers(tenant, "finance", subject="alice")
    opened = await decide(h, runtime, decision_request(
        run={"id": f"run-{uuid.uuid4().hex[:8]}"}, args=refund_args()))
    approval_id = opened["approval"]["id"]

    async def read(query: str, key: str, which: str) -> tuple[Any, ...]:
        target = approval_id if which == "real" else which
        resp = await h.client.get(f"/v1/approvals/{target}{query}", headers=keys[key])
        return _shape(resp)

    answers = [await read(*case) for case in READS]
    assert (await review(h, finance, approval_id)).status_code == 200
    answers.append(await read("?wait=5", "runtime", "real"))  # approved: the permit
    return answers


#: per-run values besides the lean test's (the run and the review page of this approval)
PER_RUN = VOLATILE | {"run_id", "review_url", "subject", "reviewer", "at", "args_hash",
                      "input_hash", "context_hash"}


def _stable(value: Any) -> Any:
    """The answer without per-run values (ids, times), as (key, value) pairs in the
    wire's order."""
    if isinstance(value, dict):
        return [(k, "<volatile>" if k in PER_RUN or k.endswith("_at") else _stable(v))
                for k, v in value.items()]
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _shape(resp: httpx.Response) -> tuple[Any, ...]:
    return (resp.status_code, resp.headers.get("content-type"),
            resp.headers.get("www-authenticate"), resp.headers.get("retry-after"),
            resp.headers.get("content-length") is not None,
            _stable(resp.json()) if resp.content else None)


async def test_long_poll_read_is_served_lean_and_answers_as_fastapi(
        harness_factory: Any, tenant: str) -> None:
    lean = await harness_factory()
    plain = await harness_factory()
    without_lean(plain.app)
    fast, slow = await _answers(lean, tenant), await _answers(plain, tenant)
    assert fast == slow
    assert [a[0] for a in fast] == [200, 200, 200, 200, 404, 200, 401, 401,
                                    422, 422, 422, 200, 422, 422, 200]
    assert ("status", "pending") in fast[2][5]
    assert ("status", "approved") in fast[-1][5]
    assert dict(fast[-1][5])["permit"] is not None
    # one decision each, then the reads the lean path accepts and the approved read
    assert lean_served(lean.app) == 1 + LEAN + 1

