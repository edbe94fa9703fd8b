"""Hypothesis settings for the whole suite (a pytest plugin loaded by tests/conftest.py).

Property tests check results, never speed (speed is measured in bench/). Hypothesis's
default 200 ms per-example deadline and its ``too_slow`` health check are timing checks:
on a loaded 2-core CI machine a descheduled example fails them ("Unreliable test timings")
although the code is right, so the suite's profile turns them off; every other health check
stays on.

``COSIGNER_HYPOTHESIS_SCALE=N`` multiplies every property test's ``max_examples`` (those set
by ``@settings`` too) for a deeper search, e.g. with several ``--hypothesis-seed`` values::

    COSIGNER_HYPOTHESIS_SCALE=20 pytest --hypothesis-seed=1 tests/core/test_canonical.py
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("cosigner", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "cosigner"))

SCALE = int(os.environ.get("COSIGNER_HYPOTHESIS_SCALE", "1"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if SCALE == 1:
        return
    for item in items:
        test: Any = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        if not getattr(test, "is_hypothesis_test", False) or getattr(test, "_scaled", False):
            continue  # parametrized tests share one function: scale it once
        # @given keeps the test's settings here and reads them on each call.
        current = test._hypothesis_internal_use_settings
        test._hypothesis_internal_use_settings = settings(
            current, max_examples=current.max_examples * SCALE, deadline=None)
        test._scaled = True
