"""The embedded Rego engine decides on the exact arguments or not at all.

rego-cpp takes strings as C strings: through regopy, ``/srv/mcp/a\\0/../../../etc/passwd``
reached rego/mcp_filesystem as ``/srv/mcp/a`` and was allowed, while the tool would get
the whole path. The engine now refuses such input (cosigner/policy/rego_input.py), so the
decision is a recorded ``policy_error`` deny without a permit.
"""

from __future__ import annotations

from typing import Any

from tests.conftest import Harness, decision_request


async def test_a_nul_in_a_path_is_a_policy_error_deny_not_a_shorter_path(
        harness: Harness) -> None:
    runtime = await harness.headers("mcp-demo", "runtime")  # served by rego/mcp_filesystem
    for path in ["/srv/mcp/a\u0000/../../../etc/passwd", "/srv/mcp\u0000"]:
        body: dict[str, Any] = decision_request(tool={"name": "filesystem.read_text_file"},
                                                args={"path": path})
        resp = await harness.client.post("/v1/decisions", headers=runtime, json=body)
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        assert answer["effect"] == "deny" and answer["permit"] is None
        assert [r["code"] for r in answer["reasons"]] == ["policy_error"]
    inside = decision_request(tool={"name": "filesystem.read_text_file"},
                              args={"path": "/srv/mcp/a"})
    resp = await harness.client.post("/v1/decisions", headers=runtime, json=inside)
    assert resp.json()["effect"] == "allow"
