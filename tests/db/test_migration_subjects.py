"""Migration ``0007_subjects``: subjects become canonical; a collision stops it with a
report, never a silent merge (issue 13, fault 3; case K29)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from cosigner.db.migrate import alembic_config, upgrade
from tests.conftest import PG_BASE_URL, _pg_admin


@pytest.fixture
def empty_url(db_kind: str, tmp_path: Path) -> Iterator[str]:
    """An empty database of the kind under test (its own PostgreSQL database)."""
    if db_kind != "postgres":
        yield f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
        return
    name = f"cosigner_mig_{uuid.uuid4().hex[:10]}"
    _pg_admin(f'CREATE DATABASE "{name}"')
    yield PG_BASE_URL.rsplit("/", 1)[0] + "/" + name
    _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _upgrade_to(url: str, revision: str) -> None:
    engine = create_async_engine(url)

    def run(connection: Any) -> None:
        cfg = alembic_config(url)
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)

    try:
        async with engine.begin() as conn:
            await conn.run_sync(run)
    finally:
        await engine.dispose()


async def _sql(url: str, sql: str, **params: Any) -> list[Any]:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            result = await conn.execute(text(sql), params)
            return list(result.all()) if result.returns_rows else []
    finally:
        await engine.dispose()


async def _principal(url: str, principal_id: str, tenant: str, subject: str) -> None:
    await _sql(url, "INSERT INTO principals (id, tenant, subject, kind, roles, disabled, "
               "created_at) VALUES (:id, :tenant, :subject, 'key', '[\"finance\"]', false, "
               ":now)", id=principal_id, tenant=tenant, subject=subject,
               now=datetime.now(UTC))


def test_k29_colliding_principals_stop_the_migration_with_a_report(empty_url: str) -> None:
    async def run() -> None:
        await _upgrade_to(empty_url, "0006_linear")
        await _principal(empty_url, "p-1", "acme", "alice@corp.example")
        await _principal(empty_url, "p-2", "acme", "Alice@Corp.Example")
        await _principal(empty_url, "p-3", "acme", "Bob@Corp.Example")
        await _principal(empty_url, "p-4", "other", "ALICE@corp.example")  # other tenant
        with pytest.raises(Exception, match="0007_subjects stopped") as caught:
            await upgrade(empty_url)
        report = str(caught.value)
        assert "'acme'" in report and "id p-1" in report and "id p-2" in report
        assert "p-3" not in report and "p-4" not in report
        # Nothing changed: still at 0006, every spelling as it was.
        assert await _sql(empty_url, "SELECT version_num FROM alembic_version") == [
            ("0006_linear",)]
        rows = await _sql(empty_url, "SELECT id, subject FROM principals ORDER BY id")
        assert [tuple(r) for r in rows] == [
            ("p-1", "alice@corp.example"), ("p-2", "Alice@Corp.Example"),
            ("p-3", "Bob@Corp.Example"), ("p-4", "ALICE@corp.example")]

        # The operator resolves the collision; the migration then canonicalises.
        await _sql(empty_url, "DELETE FROM principals WHERE id = 'p-2'")
        await upgrade(empty_url)
        rows = await _sql(empty_url, "SELECT id, subject, display_name FROM principals "
                          "ORDER BY id")
        assert [tuple(r) for r in rows] == [
            ("p-1", "alice@corp.example", "alice@corp.example"),
            ("p-3", "bob@corp.example", "Bob@Corp.Example"),
            ("p-4", "alice@corp.example", "ALICE@corp.example")]

    asyncio.run(run())


def test_k29_cli_migrate_reports_a_collision_without_a_traceback(
        empty_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from cosigner.cli.main import main

    async def prepare() -> None:
        await _upgrade_to(empty_url, "0006_linear")
        await _principal(empty_url, "p-1", "acme", "alice@corp.example")
        await _principal(empty_url, "p-2", "acme", "ＡＬＩＣＥ@corp.example")

    asyncio.run(prepare())
    monkeypatch.setenv("COSIGNER_DATABASE_URL", empty_url)
    assert main(["migrate"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: migration stopped: 0007_subjects stopped"), err
    assert "id p-1" in err and "id p-2" in err and "Traceback" not in err
