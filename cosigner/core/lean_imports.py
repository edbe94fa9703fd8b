"""Two third-party packages imported without the parts Cosigner does not use, until
something asks for them (issue 20, idle memory).

- ``sqlalchemy.ext.asyncio``: Cosigner uses SQLAlchemy Core only (``AsyncEngine``,
  ``AsyncConnection``, ``AsyncResult``). The package's ``__init__`` also imports its
  ``AsyncSession`` (``session.py``, ``scoping.py``), which imports the whole ORM
  (``sqlalchemy.orm``): ~6 MB resident in every server process, used by nothing.
- ``uvicorn``: its ``__init__`` imports ``uvicorn.main`` (the command line: click, and the
  reload supervisor: watchfiles), ~1.2 MB; ``cosigner serve`` uses ``Config`` and ``Server``.

:func:`install` puts a finder first on ``sys.meta_path`` that loads each of these packages
from the real one (same file, same ``__path__``, same submodules) with a shorter
``__init__``: the names it binds from the submodules Cosigner uses, exactly as the real one
binds them. The first lookup of any other name (``AsyncSession``, ``uvicorn.run``,
``__version__``, ...) runs the real ``__init__`` in the module, so from then on the module
is the real one, name for name (``tests/test_idle_imports.py`` checks both). The finder
steps aside for a package already imported, and does nothing to any other import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Any

#: Package → the lean ``__init__``: what the real one binds from the submodules used here
#: (for SQLAlchemy 2.x, then its greenlet set-up). Other names come from the real one.
LEAN: dict[str, str] = {"sqlalchemy.ext.asyncio": """
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
""", "uvicorn": """
from uvicorn.config import Config
from uvicorn.server import Server
"""}


class _LeanLoader(importlib.abc.Loader):
    """Runs the package's lean ``__init__`` (:data:`LEAN`) in the module and gives it a
    ``__getattr__`` that runs the real ``__init__`` (once) for any other name."""

    def __init__(self, name: str, path: str) -> None:
        self.name = name
        self.path = path
        # Re-entrant: the real ``__init__`` may look a name up in its own module (a
        # ``from . import submodule``) while this thread runs it.
        self.lock = threading.RLock()
        self.completed = False

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        namespace = module.__dict__
        exec(compile(LEAN[self.name], self.path, "exec"), namespace)  # noqa: S102
        loader = self

        def __getattr__(name: str) -> Any:  # noqa: N807 - PEP 562 module attribute hook
            # Another thread asking while the real ``__init__`` runs waits for it here: the
            # hook stays in place until every name is bound (removed first, a concurrent
            # lookup of a name not bound yet failed with AttributeError).
            with loader.lock:
                if not loader.completed:
                    loader.completed = True  # this thread's own lookups meanwhile: below
                    with open(loader.path, encoding="utf-8") as source:
                        exec(compile(source.read(), loader.path, "exec"), namespace)  # noqa: S102
                    if namespace.get("__getattr__") is __getattr__:
                        del namespace["__getattr__"]
            try:
                return namespace[name]
            except KeyError:
                raise AttributeError(
                    f"module {loader.name!r} has no attribute {name!r}") from None

        namespace["__getattr__"] = __getattr__


class _LeanFinder(importlib.abc.MetaPathFinder):
    """Finds the packages of :data:`LEAN` where the path finder would, with
    :class:`_LeanLoader`."""

    def find_spec(self, fullname: str, path: Any = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in LEAN:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None or not spec.submodule_search_locations:
            return None  # not a package on disk: the normal machinery decides
        lean = importlib.machinery.ModuleSpec(fullname, _LeanLoader(fullname, spec.origin),
                                              origin=spec.origin, is_package=True)
        lean.submodule_search_locations = spec.submodule_search_locations
        lean.has_location = True
        return lean


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once). Without effect on a package
    already imported."""
    if not any(isinstance(finder, _LeanFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _LeanFinder())
