"""``cosigner serve`` for operators (issue 21): the startup line, the no-bundle warning,
``--workers`` (PostgreSQL only) with metrics summed over the worker processes."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from cosigner.app import database_label
from cosigner.cli.main import main
from tests.conftest import start_module_server
from tests.http.approval_helpers import scripted, write_scripted_bundle
from tests.http.test_metrics import keys

TOKEN = "metrics-token-0123456789"


def test_database_label_has_no_credentials() -> None:
    label = database_label("postgresql+asyncpg://cosigner:s3cret-pw@db.internal:5432/prod")
    assert "s3cret-pw" not in label and "cosigner@" not in label
    assert label == "postgresql+asyncpg://db.internal:5432/prod"


async def test_startup_line_and_no_bundle_warning(
        harness_factory: Callable[..., Any], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cosigner")
    h = await harness_factory(bundle_dirs=[tmp_path / "empty"])
    started = [r for r in caplog.records if r.getMessage().startswith("cosigner started:")]
    assert len(started) == 1
    line = started[0].getMessage()
    assert "bundles=[none]" in line and h.context.keyring.current_kid in line
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and "no policy bundle serves any tenant" in r.getMessage()]
    assert len(warnings) == 1


async def test_startup_line_names_active_bundles(
        harness_factory: Callable[..., Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cosigner")
    await harness_factory()
    (line,) = [r.getMessage() for r in caplog.records
               if r.getMessage().startswith("cosigner started:")]
    assert "refunds@" in line
    assert not [r for r in caplog.records if "no policy bundle" in r.getMessage()]


def test_workers_need_postgresql(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COSIGNER_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path}/c.db")
    assert main(["serve", "--workers", "2"]) == 2
    assert not (tmp_path / "c.db").exists()  # refused before anything was touched


def test_workers_sum_their_metrics(tmp_path: Path, db_kind: str, pg_url: str | None,
                                   sqlite_template: Path, tenant: str) -> None:
    if db_kind != "postgres":
        pytest.skip("--workers needs PostgreSQL")
    bundles = write_scripted_bundle(tmp_path / "bundles")
    (tmp_path / "prom").mkdir()
    server, database_url = start_module_server(
        tmp_path, db_kind=db_kind, pg_url=pg_url, sqlite_template=sqlite_template,
        bundle_dirs=[bundles], args=("--workers", "2"), COSIGNER_METRICS_TOKEN=TOKEN,
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prom"))
    try:
        runtime = keys(database_url, tenant)["runtime"]

        def decide(_: int) -> int:  # a new connection each: the workers share them
            return httpx.post(server.url + "/v1/decisions", timeout=10,
                              headers={"Authorization": f"Bearer {runtime}"},
                              json=scripted({"effect": "allow", "reasons": ["fine"]})
                              ).status_code

        def worker_shares() -> list[float]:
            return [sum(
                s.value for family in MultiProcessCollector._read_metrics([str(path)]).values()
                for s in family.samples if s.name == "cosigner_decisions_total"
                and dict(s.labels) == {"effect": "allow", "reason": "fine", "mode": "on"})
                for path in (tmp_path / "prom").glob("counter_*.db")]

        # Which worker accepts a connection is the kernel's choice, and the second worker
        # may still be starting when the first answers: send rounds until both have decided
        # (CI once saw all of 40 requests taken by one worker).
        count, deadline = 0, time.monotonic() + 60
        with ThreadPoolExecutor(8) as pool:
            while True:
                assert set(pool.map(decide, range(40))) == {200}
                count += 40
                shares = worker_shares()
                if len([s for s in shares if s > 0]) == 2 or time.monotonic() > deadline:
                    break
        assert sum(shares) == count and len(shares) == 2, (count, shares)
        assert min(shares) > 0, shares  # both workers decided: the scrape must sum them
        for _ in range(4):  # whichever worker answers the scrape sums every worker's
            resp = httpx.get(server.url + "/metrics", timeout=10,
                             headers={"Authorization": f"Bearer {TOKEN}"})
            assert resp.status_code == 200
            total = sum(s.value for family in text_string_to_metric_families(resp.text)
                        for s in family.samples
                        if s.name == "cosigner_decisions_total"
                        and s.labels == {"effect": "allow", "reason": "fine",
                                         "mode": "on"})
            assert total == count
    finally:
        server.stop()
