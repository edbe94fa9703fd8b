"""Stand between the gate and an MCP server and write down every line the server is sent.

    python tap.py LOG -- command ...

Each line the server reads on stdin is appended to LOG first (so a test can prove a call
never reached the server); the server's pid goes to LOG.pid (so a test can kill the real
server, not this tap). Stdout and stderr are the server's own. Exits with its status.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path


def main() -> int:
    log = Path(sys.argv[1])
    command = sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:]
    child = subprocess.Popen(command, stdin=subprocess.PIPE)
    Path(f"{log}.pid").write_text(str(child.pid))
    stdin = child.stdin
    assert stdin is not None

    def pump() -> None:
        with log.open("ab") as out:
            for line in sys.stdin.buffer:
                out.write(line)
                out.flush()
                try:
                    stdin.write(line)
                    stdin.flush()
                except (BrokenPipeError, ValueError):
                    return
        stdin.close()

    threading.Thread(target=pump, daemon=True).start()
    return child.wait()


if __name__ == "__main__":
    os._exit(main())  # not sys.exit: the pump thread may still hold stdin's lock
