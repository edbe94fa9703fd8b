"""Cosigner: a policy decision and approval server for AI-agent tool calls."""

from cosigner.core import lean_imports

# SQLAlchemy's asyncio package without its ORM session, uvicorn without its command line,
# until something asks for them (issue 20, idle memory).
lean_imports.install()
