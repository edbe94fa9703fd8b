"""Starter policy (Python rules): ``decide(input)`` returns the policy result.

``read_file`` is allowed; ``send_email`` needs one person with the role ``approver``
(not the initiator); anything else is denied. ``input`` is the decision input document
(README § Policy input).
"""

from typing import Any

APPROVER = {"require": [{"role": "approver", "count": 1}], "timeout_ms": 3_600_000,
            "distinct_from": "initiator"}


def decide(input: dict[str, Any]) -> dict[str, Any]:
    tool = input["tool"]["name"]
    if tool == "read_file":
        return {"effect": "allow", "reasons": [{"code": "read_only", "message": "a read"}]}
    if tool == "send_email":
        return {"effect": "require_approval", "approval": APPROVER,
                "reasons": [{"code": "needs_approval", "message": "email leaves the house"}]}
    return {"effect": "deny", "reasons": [{"code": "tool_not_allowed",
                                           "message": f"{tool} is not allowed"}]}
