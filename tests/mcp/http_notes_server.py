"""A real MCP server speaking Streamable HTTP (the official ``mcp`` SDK's ``MCPServer``
with its ``streamable-http`` transport), for the gate's HTTP tests.

    python http_notes_server.py PORT LOG

Tools ``read_note``, ``write_note`` and ``delete_notes``; each call the server actually
runs is appended to LOG as one JSON line, so a test can prove a call never reached it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

PORT, LOG = int(sys.argv[1]), Path(sys.argv[2])
app = MCPServer("notes")


def _ran(tool: str, **args: str) -> None:
    with LOG.open("a") as out:
        out.write(json.dumps({"tool": tool, "args": args}) + "\n")


@app.tool()
def read_note(name: str) -> str:
    """Read a note."""
    _ran("read_note", name=name)
    return f"note {name}: hello"


@app.tool()
def write_note(name: str, text: str) -> str:
    """Write a note."""
    _ran("write_note", name=name, text=text)
    return f"wrote {name}"


@app.tool()
def delete_notes(pattern: str) -> str:
    """Delete notes."""
    _ran("delete_notes", pattern=pattern)
    return "deleted"


if __name__ == "__main__":
    app.run("streamable-http", host="127.0.0.1", port=PORT)
