"""``sqlalchemy.ext.asyncio`` without the ORM until something asks for it (issue 20, idle
memory).

Cosigner uses SQLAlchemy Core only: ``AsyncEngine``, ``AsyncConnection``, ``AsyncResult``.
The package's ``__init__`` also imports its ``AsyncSession`` (``session.py``,
``scoping.py``), which imports the whole ORM (``sqlalchemy.orm``): ~5.7 MB resident in
every server process (``bench/import_rss.py``), used by nothing.

:func:`install` puts a finder first on ``sys.meta_path`` that loads the real package (same
file, same ``__path__``, same submodules) with a shorter ``__init__``: the names of
``engine.py`` and ``result.py`` and the greenlet set-up, exactly as the real one does them.
The first lookup of any other name (``AsyncSession``, ``async_sessionmaker``, ...) runs the
real ``__init__`` in the module, so from then on the module is the real one, name for name
(``tests/test_idle_imports.py`` checks both). The finder steps aside when the package is
already imported, and does nothing to any other import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Any

PACKAGE = "sqlalchemy.ext.asyncio"

#: What the real ``__init__`` binds from ``engine.py`` and ``result.py`` (SQLAlchemy 2.x),
#: then its greenlet set-up. Names not found here come from the real ``__init__``.
LEAN_INIT = """
from .engine import async_engine_from_config as async_engine_from_config
from .engine import AsyncConnection as AsyncConnection
from .engine import AsyncEngine as AsyncEngine
from .engine import AsyncTransaction as AsyncTransaction
from .engine import create_async_engine as create_async_engine
from .engine import create_async_pool_from_url as create_async_pool_from_url
from .result import AsyncMappingResult as AsyncMappingResult
from .result import AsyncResult as AsyncResult
from .result import AsyncScalarResult as AsyncScalarResult
from .result import AsyncTupleResult as AsyncTupleResult
from ...util import concurrency

concurrency._concurrency_shim._initialize()
del concurrency
"""


class _LeanLoader(importlib.abc.Loader):
    """Runs :data:`LEAN_INIT` in the package module and gives it a ``__getattr__`` that
    runs the real ``__init__`` (once) for any other name."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        namespace = module.__dict__
        exec(compile(LEAN_INIT, self.path, "exec"), namespace)  # noqa: S102
        loader = self

        def __getattr__(name: str) -> Any:  # noqa: N807 - PEP 562 module attribute hook
            if name.startswith("__"):
                raise AttributeError(name)
            with loader.lock:
                if namespace.get("__getattr__") is __getattr__:
                    del namespace["__getattr__"]
                    with open(loader.path, encoding="utf-8") as source:
                        exec(compile(source.read(), loader.path, "exec"), namespace)  # noqa: S102
            try:
                return namespace[name]
            except KeyError:
                raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}") from None

        namespace["__getattr__"] = __getattr__


class _LeanFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`PACKAGE` where the path finder would, with :class:`_LeanLoader`."""

    def find_spec(self, fullname: str, path: Any = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != PACKAGE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None or not spec.submodule_search_locations:
            return None  # not a package on disk: the normal machinery decides
        lean = importlib.machinery.ModuleSpec(fullname, _LeanLoader(spec.origin),
                                              origin=spec.origin, is_package=True)
        lean.submodule_search_locations = spec.submodule_search_locations
        lean.has_location = True
        return lean


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once). Without effect when
    ``sqlalchemy.ext.asyncio`` is already imported."""
    if not any(isinstance(finder, _LeanFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _LeanFinder())
