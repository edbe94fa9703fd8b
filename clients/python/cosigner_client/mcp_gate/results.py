"""What the gate answers an MCP client instead of running a tool: tool error results.

Every refusal is a ``CallToolResult`` with ``isError: true`` (MCP § Tools, error
handling: errors the model should see and react to are results, not protocol errors).
Its text names the reason codes and, for approvals, the review link; ``_meta.cosigner``
carries the same facts as data (``code``, ``reasons``, ``decision_id``, ``approval_id``,
``review_url``) for clients that read it.
"""

from __future__ import annotations

from typing import Any

from mcp_types import JSONRPCResponse, RequestId

from cosigner_client.errors import GateUnavailable
from cosigner_client.models import Approval, Decision

META_KEY = "cosigner"


def tool_error(request_id: RequestId, text: str, *, code: str, **facts: Any) -> JSONRPCResponse:
    """A JSON-RPC response carrying a tool error result (``isError: true``)."""
    meta = {"code": code, **{k: v for k, v in facts.items() if v is not None}}
    return JSONRPCResponse(jsonrpc="2.0", id=request_id, result={
        "content": [{"type": "text", "text": text}], "isError": True,
        "_meta": {META_KEY: meta}})


def reason_codes(decision: Decision) -> list[str]:
    return [r.code for r in decision.reasons] or [decision.effect]


def requirement(approval: Approval) -> str:
    """``maintainer 0/1`` for each required role group."""
    groups = approval.progress or approval.require
    parts = [f"{g.get('role')} {g.get('approved', 0)}/{g.get('count')}" for g in groups]
    return ", ".join(parts) or "an approval"


def denied(request_id: RequestId, tool: str, decision: Decision) -> JSONRPCResponse:
    codes = reason_codes(decision)
    if isinstance(decision.error, GateUnavailable):
        text = (f"Cosigner could not be asked about {tool} ({decision.error.code}: "
                f"{decision.error.detail}). The call was not run (fail closed).")
    elif decision.error is not None and decision.decision_id is None:
        text = (f"Cosigner refused to decide on {tool} ({decision.error.code}: "
                f"{decision.error.detail}). The call was not run.")
    else:
        why = "; ".join(f"{r.code}: {r.message}" if r.message else r.code
                        for r in decision.reasons)
        text = f"Cosigner denied {tool} ({why}). The call was not run."
    return tool_error(request_id, text, code=codes[0], reasons=codes,
                      decision_id=decision.decision_id)


def not_approved(request_id: RequestId, tool: str, decision: Decision, approval: Approval,
                 *, waited_s: float) -> JSONRPCResponse:
    """Rejected, expired, cancelled, still pending after the wait, or not followable."""
    codes = reason_codes(decision)
    facts = {"reasons": codes, "decision_id": decision.decision_id,
             "approval_id": approval.id, "review_url": approval.review_url}
    review = f" Review: {approval.review_url}" if approval.review_url else ""
    if approval.status == "pending":
        code = approval.error.code if approval.error else "timeout"
        if code == "timeout":
            text = (f"{tool} needs approval ({requirement(approval)}; reasons "
                    f"{', '.join(codes)}) and is still pending after "
                    f"{waited_s:.0f} s.{review} The call was not run; call it again with the "
                    "same arguments once it is approved.")
            return tool_error(request_id, text, code="approval_pending", **facts)
        text = (f"The approval of {tool} could not be followed ({code}).{review} "
                "The call was not run.")
        return tool_error(request_id, text, code=code, **facts)
    text = f"The approval of {tool} was {approval.status}.{review} The call was not run."
    return tool_error(request_id, text, code=f"approval_{approval.status}", **facts)


def redeem_refused(request_id: RequestId, tool: str, decision: Decision, code: str
                   ) -> JSONRPCResponse:
    return tool_error(request_id, f"Cosigner refused the permit for {tool} ({code}). "
                      "The call was not run.", code=code, decision_id=decision.decision_id)


def server_down(request_id: RequestId, tool: str, why: str) -> JSONRPCResponse:
    return tool_error(request_id, f"The MCP server is not running ({why}); {tool} was not run.",
                      code="server_unavailable")


def server_lost(request_id: RequestId, tool: str, why: str, decision: Decision
                ) -> JSONRPCResponse:
    return tool_error(request_id, f"The MCP server stopped while running {tool} ({why}); "
                      "whether it took effect is unknown.", code="server_exited",
                      decision_id=decision.decision_id)


def gate_failed(request_id: RequestId, tool: str, code: str, detail: str) -> JSONRPCResponse:
    return tool_error(request_id, f"The Cosigner gate could not check {tool} ({code}: "
                      f"{detail}). The call was not run (fail closed).", code=code)
