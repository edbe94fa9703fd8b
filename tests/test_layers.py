"""The house rules of the package, checked on its source (STYLE.md § Layout, issue 14).

* no import cycle between modules, counting imports under ``TYPE_CHECKING`` too;
* domain code imports neither fastapi nor starlette (HTTP lives in ``http`` and ``web``);
* imports run one way through the areas: a module may import its own area or a lower one
  (:data:`RANKS`), never a higher or a sibling area.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "cosigner"

#: Areas from the bottom up. An area imports only areas of a lower rank (or itself).
RANKS = {
    "core": 0,
    "": 1,  # the package's own __init__: it installs core.lean_imports, nothing else
    "db": 1,
    "keys": 2, "webhooks": 2,
    "audit": 3,
    "policy": 4, "identity": 4,
    "runs": 5,
    "context": 6,
    "permits": 7,
    "approvals": 8,
    "decisions": 9, "slack": 9,
    "tasks": 10,
    "http": 11,
    "web": 12,
    "app": 13,
    "cli": 14,
    "__main__": 15,
}
HTTP_AREAS = {"http", "web", "app", "cli", "__main__"}
HTTP_LIBRARIES = ("fastapi", "starlette")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = ("cosigner", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path) -> set[str]:
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


MODULES = _modules()
IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _internal_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, targets in IMPORTS.items():
        edges[module] = {t for t in targets if t in MODULES and t != module
                         and not module.startswith(t + ".")}
    return edges


def test_every_area_has_a_rank() -> None:
    areas = {_area(m) for m in MODULES} - {""}
    assert areas <= set(RANKS), f"areas without a rank: {sorted(areas - set(RANKS))}"


def test_no_import_cycle() -> None:
    edges = _internal_edges()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for module in sorted(edges):
        if module not in state and (cycle := visit(module)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_domain_code_imports_no_http_framework() -> None:
    offenders = sorted(
        f"{module} imports {target}"
        for module, targets in IMPORTS.items() if _area(module) not in HTTP_AREAS
        for target in targets if target.split(".")[0] in HTTP_LIBRARIES)
    assert not offenders, offenders


def test_imports_run_one_way_through_the_areas() -> None:
    offenders = []
    for module, targets in _internal_edges().items():
        area = _area(module)
        for target in targets:
            other = _area(target)
            if other and other != area and RANKS[other] >= RANKS[area]:
                offenders.append(f"{module} ({area}) imports {target} ({other})")
    assert not offenders, "\n".join(sorted(offenders))


def test_docstrings_name_modules_that_exist() -> None:
    """A ``cosigner.x.y`` or old ``server.x`` module named in the code's prose exists (the
    reshape of issue 14 left references to ``server.rejections`` and the like)."""
    # In backticks (``:mod:`x```) or parentheses, not URLs or logger names.
    named = re.compile(r"[`(]((?:cosigner|server)(?:\.[A-Za-z_]+)+)[`)]")
    # Dotted names that are not modules: the reserved tool of program barriers and the
    # access logger.
    not_modules = {"cosigner.barrier", "cosigner.access"}
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in named.findall(line):
                if name in not_modules:
                    continue
                if name.startswith("server.") or not _importable(name):
                    offenders.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {name}")
    assert not offenders, "\n".join(offenders)


def _importable(name: str) -> bool:
    """``name`` is a module, or an attribute path below one (``cosigner.a.b.func``)."""
    parts = name.split(".")
    for end in range(len(parts), 1, -1):
        try:
            if importlib.util.find_spec(".".join(parts[:end])) is not None:
                return True
        except ModuleNotFoundError:
            continue
    return False
