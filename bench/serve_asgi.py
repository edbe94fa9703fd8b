"""Serve ``module:attribute`` the way ``cosigner serve`` serves Cosigner.

``cosigner/cli/main.py`` calls ``uvicorn.run(app, host=..., port=..., log_level=...,
access_log=False)`` with uvicorn's defaults otherwise (loop and HTTP parser "auto":
uvloop and httptools when installed). The floor and the peer are served through this
file with the same call, each by the interpreter of its own venv, on uvicorn's stock
httptools protocol; ``cosigner serve`` itself uses a subclass of it that sends a
response's head and body in one write (``cosigner/http/coalesce.py``; the floor is the
bare FastAPI floor of issue 20 and keeps the stock protocol)::

    python bench/serve_asgi.py bench.floor_app:app --port 9001
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", help="module:attribute of the ASGI app")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()

    import uvicorn

    sys.path.append(str(Path(__file__).resolve().parent.parent))  # for bench.floor_app
    module, _, attribute = args.target.partition(":")
    app = getattr(importlib.import_module(module), attribute)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                access_log=False)


if __name__ == "__main__":
    main()
