"""Session 13 adversarial probes (redeem vouched for by the token digest, Rego result
memo, approval join on the raw path). Each probe that found a defect fails before its
fix."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from sqlalchemy import select

from cosigner.db.tables import audit_events
from tests.conftest import Harness, decision_request
from tests.http.approval_helpers import decide, redeem, refund_args


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _payload(token: str) -> dict[str, Any]:
    segment = token.split(".")[1]
    padded = segment + "=" * (-len(segment) % 4)
    loaded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(padded))
    return loaded


async def _minted(h: Harness, tenant: str) -> tuple[dict[str, str], str]:
    runtime = await h.headers(tenant, "runtime")
    decision = await decide(h, runtime, decision_request(args=refund_args(5000)))
    assert decision["effect"] == "allow"
    return runtime, str(decision["permit"]["token"])


@pytest.mark.parametrize("member", ["jti", "decision_id", "approval_id"])
@pytest.mark.parametrize("bad", ["\u0000", "\ud800", "x" * 5000])
async def test_s13_forged_claim_text_the_database_cannot_bind_is_bad_signature(
        harness: Harness, tenant: str, member: str, bad: str) -> None:
    """A forged token (any signature) whose payload names the caller's tenant and a jti,
    decision id or approval id the database cannot take as text (NUL: PostgreSQL; a lone
    surrogate: neither driver) is refused ``bad_signature`` and logged, as before the
    pre-read: never a 500/503 from reading the row a forged payload names."""
    runtime, token = await _minted(harness, tenant)
    header, _, signature = token.split(".")
    claims = _payload(token)
    claims[member] = bad
    text = json.dumps(claims, separators=(",", ":"))  # ensure_ascii: \\u escapes
    forged = f"{header}.{_b64(text.encode())}.{signature}"
    resp = await redeem(harness, runtime, forged, "issue_refund", refund_args(5000))
    assert (resp.status_code, resp.json()["code"]) == (403, "bad_signature"), resp.text
    async with harness.db.read() as conn:
        refused = (await conn.execute(select(audit_events.c.body).where(
            audit_events.c.tenant == tenant,
            audit_events.c.type == "permit.refused"))).scalars().all()
    assert [json.loads(body)["payload"]["code"] for body in refused] == ["bad_signature"]
    ok = await redeem(harness, runtime, token, "issue_refund", refund_args(5000))
    assert ok.status_code == 200, ok.text
