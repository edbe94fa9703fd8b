"""cosigner-client: run the three gates of Cosigner (decide → redeem → report) around
every agent tool call, failing closed.

    from cosigner_client import Gate
    gate = Gate("http://127.0.0.1:8080", api_key, principal="customer-42",
                initiator="agent-support")
    gate.start_run("run-1", allowed_tools=["get_order"], max_tool_calls=20)
    result = gate.call("get_order", {"order_id": "ord_8472"}, get_order)
"""

from cosigner_client.canonical import args_hash, canonicalize, parse_json
from cosigner_client.errors import (
    CallRefused,
    GateError,
    GateUnavailable,
    InvalidArguments,
    ServerRefused,
)
from cosigner_client.frameworks import ToolCall, from_anthropic, from_openai
from cosigner_client.gate import AsyncGate, Gate
from cosigner_client.models import (
    Approval,
    CallResult,
    Catalogue,
    Decision,
    OutcomeReport,
    Permit,
    Reason,
    Redemption,
    Run,
)

__all__ = [
    "Approval", "AsyncGate", "CallRefused", "CallResult", "Catalogue", "Decision", "Gate",
    "GateError", "GateUnavailable", "InvalidArguments", "OutcomeReport", "Permit", "Reason",
    "Redemption", "Run", "ServerRefused", "ToolCall", "args_hash", "canonicalize",
    "from_anthropic", "from_openai", "parse_json",
]
__version__ = "0.1.0"
