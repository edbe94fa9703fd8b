"""``cosigner principals add-user`` and ``cosigner principals disable``."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from sqlalchemy import select

from cosigner.cli.main import main
from cosigner.core.clock import system_clock
from cosigner.core.errors import Unauthenticated
from cosigner.db.database import Database
from cosigner.db.tables import principals
from cosigner.identity import accounts
from tests.web.conftest import PASSWORD


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, database_url: str, tmp_path: Path) -> str:
    monkeypatch.setenv("COSIGNER_DATABASE_URL", database_url)
    monkeypatch.setenv("COSIGNER_KEY_DIR", str(tmp_path / "keys"))
    return database_url


def _signin(url: str, tenant: str, name: str, password: str) -> str:
    async def run() -> str:
        db = Database(url)
        try:
            caller = await accounts.authenticate_password(
                db, tenant=tenant, name=name, password=password, address="198.51.100.7",
                clock=system_clock)
            return ",".join(sorted(caller.roles))
        finally:
            await db.dispose()

    return asyncio.run(run())


def test_add_user_reads_the_password_from_stdin(env: str, tenant: str,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    assert main(["principals", "add-user", "fiona", "--tenant", tenant, "--role", "finance",
                 "--role", "security", "--password-stdin"]) == 0
    out = capsys.readouterr()
    assert PASSWORD not in out.out + out.err
    assert _signin(env, tenant, "fiona", PASSWORD) == "finance,security"


def test_add_user_prompts_twice_and_refuses_a_mismatch(env: str, tenant: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([PASSWORD, PASSWORD + "x"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    assert main(["principals", "add-user", "fiona", "--tenant", tenant,
                 "--role", "finance"]) == 1


def test_disable_refuses_sign_in(env: str, tenant: str,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    main(["principals", "add-user", "fiona", "--tenant", tenant, "--role", "finance",
          "--password-stdin"])
    assert main(["principals", "disable", "fiona", "--tenant", tenant]) == 0
    with pytest.raises(Unauthenticated):
        _signin(env, tenant, "fiona", PASSWORD)
    assert main(["principals", "disable", "nobody", "--tenant", tenant]) == 1

    async def disabled() -> bool:
        db = Database(env)
        try:
            async with db.read() as conn:
                return bool((await conn.execute(select(principals.c.disabled).where(
                    principals.c.tenant == tenant, principals.c.subject == "fiona")))
                    .scalar_one())
        finally:
            await db.dispose()

    assert asyncio.run(disabled())
