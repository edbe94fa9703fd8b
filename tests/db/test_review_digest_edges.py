"""Review (session 5): hash columns holding texts that are not lower-case digests survive
0020's upgrade and downgrade unchanged on both databases, and the upgrade stores exactly
what :func:`cosigner.db.digest.pack` would (PostgreSQL converts in SQL, SQLite in Python:
the two must agree byte for byte, or a row written before 0020 reads back differently
from one written after)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import create_async_engine

from cosigner.db import compressed, digest
from cosigner.db.migrate import upgrade
from cosigner.db.tables import decisions
from tests.db.test_facts_once import _down, _to
from tests.db.test_migrate import empty_database  # noqa: F401 - fixture

EDGES = [
    "",
    "a" * 31,                      # 31 bytes: 0x00 + text would be 32 (a digest's length)
    "é" * 15 + "a",                # 31 UTF-8 bytes, 16 characters
    "😀" * 7 + "abc",              # 31 UTF-8 bytes, astral characters
    "a" * 32,
    "\x01abc",                     # starts with the marker byte
    "sha256:" + "AB" * 32,         # upper-case hex: a text, not a digest
    "sha256:" + "ab" * 31 + "a",   # 70 characters
    "sha256:" + "ab" * 31 + "ag",  # not hex
    "sha256:" + "ab" * 32,         # the digest form
    "ü" * 71,                      # 71 characters, 142 bytes
]


async def test_edge_hash_texts_survive_upgrade_and_downgrade(
        empty_database: str) -> None:  # noqa: F811
    url = empty_database
    engine = create_async_engine(url)
    now = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0019_bounded_pending")
            for i, value in enumerate(EDGES):
                await conn.execute(text(
                    "INSERT INTO decisions (id, tenant, request_id, request_hash, run_id, "
                    "tool, args_hash, policy_revision, effect, caller, response, created_at) "
                    "VALUES (:k, 't-edge', :k, :h, 'r', 't', :h, :h, 'allow', 'c', :v, :at)"),
                    {"k": f"e{i:02d}", "h": value, "at": now,
                     "v": compressed.compress(b'{"permit":null}')})
        await upgrade(url)
        async with engine.connect() as conn:
            raw = (await conn.execute(text(
                "SELECT request_hash, args_hash, policy_revision FROM decisions "
                "WHERE tenant = 't-edge' ORDER BY id"))).all()
            typed = (await conn.execute(select(
                decisions.c.request_hash, decisions.c.args_hash, decisions.c.policy_revision)
                .where(decisions.c.tenant == "t-edge").order_by(decisions.c.id))).all()
        stored: list[Any] = [bytes(r[0]) for r in raw]
        assert stored == [digest.pack(v) for v in EDGES]
        assert [tuple(r) for r in typed] == [(v, v, v) for v in EDGES]
        async with engine.begin() as conn:
            await conn.run_sync(_down, url)
        await engine.dispose()  # prepared statements of the bytea columns
        async with engine.connect() as conn:
            down = (await conn.execute(text(
                "SELECT request_hash, args_hash, policy_revision FROM decisions "
                "WHERE tenant = 't-edge' ORDER BY id"))).all()
        assert [tuple(r) for r in down] == [(v, v, v) for v in EDGES]
    finally:
        await engine.dispose()
        await asyncio.sleep(0)
