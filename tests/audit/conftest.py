"""Helpers for decision-log tests: make decisions, take checkpoints, pull an export."""

from __future__ import annotations

import io
import json
from typing import Any

from tests.conftest import Harness, decision_request


async def decide(h: Harness, headers: dict[str, str], amount: int = 5000,
                 **overrides: Any) -> dict[str, Any]:
    body = decision_request(**overrides)
    if "args" not in overrides:
        body["args"]["amount_minor"] = amount
    resp = await h.client.post("/v1/decisions", headers=headers, json=body)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


async def checkpoint(h: Harness, auditor: dict[str, str]) -> dict[str, Any]:
    resp = await h.client.post("/v1/audit/checkpoints", headers=auditor)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()["checkpoint"]
    return data


async def export_lines(h: Harness, auditor: dict[str, str], **params: str) -> list[str]:
    resp = await h.client.get("/v1/audit/export", headers=auditor,
                              params={"format": "jsonl", **params})
    assert resp.status_code == 200, resp.text
    # LF only, as `cosigner audit verify` reads a file: RFC 8785 leaves U+2028, U+2029 and
    # U+0085 raw inside strings, where str.splitlines() would cut a line in two.
    return list(io.StringIO(resp.text, newline="\n"))


async def jwks(h: Harness) -> dict[str, Any]:
    data: dict[str, Any] = (await h.client.get("/.well-known/jwks.json")).json()
    return data


async def seeded_export(h: Harness, tenant: str, decisions: int = 9,
                        every: int = 3) -> list[str]:
    """An export of ``decisions`` allow/deny/approval decisions with a checkpoint every
    ``every`` decisions (and one at the head)."""
    runtime = await h.headers(tenant, "runtime")
    auditor = await h.headers(tenant, "auditor")
    amounts = (5000, 150000, 250000)
    for i in range(decisions):
        await decide(h, runtime, amounts[i % 3])
        if (i + 1) % every == 0:
            await checkpoint(h, auditor)
    return await export_lines(h, auditor)


def records(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines]


async def old_and_new(h: Harness, tenant: str, clock: Any) -> dict[str, Any]:
    """Three decisions and a checkpoint (returned), then 40 days later two decisions: a
    log with something to prune (``clock`` is the harness's FrozenClock)."""
    runtime = await h.headers(tenant, "runtime")
    auditor = await h.headers(tenant, "auditor")
    for _ in range(3):
        await decide(h, runtime)
    old = await checkpoint(h, auditor)
    clock.advance(days=40)
    for _ in range(2):
        await decide(h, runtime)
    return old
