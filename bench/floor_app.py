"""The floor: a bare FastAPI endpoint returning a constant.

Served by :mod:`bench.serve_asgi` exactly as ``cosigner serve`` serves Cosigner (one
uvicorn process, same loop/HTTP implementation, ``access_log=False``), so the ratio
of a Cosigner path to this floor is the share of the HTTP stack's capacity that the
path keeps once it authenticates, evaluates policy, writes the log and signs.
"""

from __future__ import annotations

from fastapi import FastAPI

app = FastAPI(title="floor", openapi_url=None, docs_url=None, redoc_url=None)


@app.get("/")
async def constant() -> dict[str, bool]:
    """Always ``{"ok": true}``."""
    return {"ok": True}


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}
