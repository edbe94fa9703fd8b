"""`cosigner demo` plays the refund story end to end and exits 0."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_cosigner_demo_exits_zero() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSIGNER_")}
    done = subprocess.run([sys.executable, "-m", "cosigner", "demo"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "require_approval" in out and "over_auto_limit" in out
    assert "already_redeemed" in out and "args_mismatch" in out
    assert "over_hard_limit" in out and "verified" in out
    assert "demo ok: 1 refund executed" in out
