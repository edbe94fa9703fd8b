"""The README's fifteen-line integration example works as written against a live server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.client.conftest import Live

README = Path(__file__).resolve().parents[2] / "clients" / "python" / "README.md"


def example() -> str:
    text = README.read_text("utf-8")
    block = re.search(r"<!-- example:start -->\n```python\n(.*?)```\n<!-- example:end -->",
                      text, re.S)
    assert block is not None
    return block.group(1)


def test_readme_example_is_at_most_fifteen_code_lines() -> None:
    lines = [line for line in example().splitlines() if line.strip()]
    assert len(lines) <= 15


def test_readme_example_runs_as_written(live: Live) -> None:
    code = example().replace("http://127.0.0.1:8080", live.url)
    env = {**os.environ, "COSIGNER_KEY": live.runtime}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.startswith("executed read_only {'order_id': 'ord_8472'")
    assert second == "deny over_hard_limit"
