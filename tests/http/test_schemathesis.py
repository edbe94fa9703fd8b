"""Property-based API test: schemathesis against a live ``cosigner serve`` process,
driven by openapi.yaml. No 5xx, and every response conforms to the schema."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT, LiveServer

pytestmark = pytest.mark.slow


def test_schemathesis_finds_no_server_errors(live_server_factory: Callable[..., LiveServer],
                                             database_url: str, tmp_path: Path) -> None:
    server = live_server_factory()
    env = dict(os.environ, COSIGNER_DATABASE_URL=database_url)
    key = subprocess.run(
        [sys.executable, "-m", "cosigner", "principals", "add-key", "--tenant",
         "schemathesis", "--role", "runtime", "--role", "auditor", "--role", "admin",
         "--role", "finance"],
        env=env, cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()
    st = Path(sys.executable).with_name("st")
    result = subprocess.run(
        [str(st), "run", str(ROOT / "openapi.yaml"), "--url", server.url,
         "-H", f"Authorization: Bearer {key}",
         "--checks", "not_a_server_error,response_schema_conformance,"
                     "content_type_conformance",
         "--max-examples", "25", "--seed", "1", "--request-timeout", "20",
         "--suppress-health-check", "all"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    summary = re.search(r"(\d+) generated, (\d+) passed", result.stdout)
    assert summary is not None and int(summary[1]) > 50, result.stdout[-3000:]
    assert summary[1] == summary[2], result.stdout[-6000:]
