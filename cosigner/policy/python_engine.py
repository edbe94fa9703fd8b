"""Python-rule engine: trusted operator code in a bundle's ``rules.py``.

The entrypoint is a function ``f(input: dict) -> dict | None``; ``None`` means
undefined. The module is loaded from the bundle's file bytes (the ones the revision
was computed over), under a name unique to the revision, so versions never mix.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from cosigner.core.errors import PolicyError


class PythonEngine:
    """Evaluate ``rules.py:<entrypoint>`` of one bundle revision."""

    def __init__(self, *, source: bytes, entrypoint: str, module_name: str, filename: str):
        module = types.ModuleType(module_name)
        module.__file__ = filename
        try:
            code = compile(source, filename, "exec")
            exec(code, module.__dict__)  # noqa: S102 - operator-trusted policy code
        except Exception as exc:  # any failure to load refuses the bundle
            raise PolicyError(f"{filename}: {type(exc).__name__}: {exc}",
                              code="policy_load_failed") from exc
        func = module.__dict__.get(entrypoint)
        if not callable(func):
            raise PolicyError(f"{filename}: entrypoint '{entrypoint}' is not a function",
                              code="policy_load_failed")
        self._func: Callable[[dict[str, Any]], Any] = func
        self.module = module

    def evaluate(self, input_doc: dict[str, Any]) -> Any:
        return self._func(input_doc)
