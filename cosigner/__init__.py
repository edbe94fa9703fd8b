"""Cosigner: a policy decision and approval server for AI-agent tool calls."""

from cosigner.db import lean_asyncio

# SQLAlchemy's asyncio package without its ORM session until one is asked for (issue 20).
lean_asyncio.install()
