"""Review probes (session 7) for cosigner.core.lean_imports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Thread one asks for a name that runs the real __init__ (the ORM import: tens of ms);
# thread two asks for another real-only name while that runs. With the real package it
# is found (the import lock, or the name already bound); it must be here too.
RACE = """
import threading, time
import cosigner  # noqa: F401 - installs the finder
import sqlalchemy.ext.asyncio as m
errors = []
def first():
    m.AsyncSession
def second():
    time.sleep(0.002)
    try:
        m.async_sessionmaker
    except AttributeError as exc:
        errors.append(repr(exc))
a, b = threading.Thread(target=first), threading.Thread(target=second)
a.start(); b.start(); a.join(); b.join()
assert not errors, errors
"""


def test_a_name_asked_for_while_the_real_init_runs_is_found() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "clients/python")])}
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", RACE], env=env, capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
