"""``cosigner-mcp-gate``: an MCP server's tool calls behind Cosigner (extra ``mcp``).

Modules: :mod:`.cli` (flags, process setup), :mod:`.relay` (the JSON-RPC relay between
client and server), :mod:`.calls` (one ``tools/call`` through the three gates),
:mod:`.results` (tool error results). Needs the official ``mcp`` SDK
(``pip install 'cosigner-client[mcp]'``).
"""

from cosigner_client.mcp_gate.cli import GateConfig, main

__all__ = ["GateConfig", "main"]
