"""The Docker image and compose file keep their invariants, and the lock is what ships.

No container engine runs here, so these tests read the Dockerfile, .dockerignore and
compose.yaml, and resolve the image's install step with pip (``--dry-run``, from a copy
of the source): the versions it would install are the lock's. README § Docker says what
was built and run where.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import yaml

from tests.conftest import ROOT


def instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for word, rest in instructions():
        if word == "FROM":
            result.append([])
        if result:
            result[-1].append((word, rest))
    return result


def lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            assert pinned, f"not pinned with ==: {line}"
            pins[name] = pinned
    return pins


def test_the_image_is_built_in_one_stage_and_runs_in_another() -> None:
    build, runtime = stages()
    assert build[0][1].endswith("AS build") and runtime[0][1].endswith("AS runtime")
    runs = " ".join(rest for word, rest in build if word == "RUN")
    assert "pip install -c requirements.lock ." in runs and "pip check" in runs
    copies = [rest for word, rest in runtime if word == "COPY"]
    assert any(c.startswith("--from=build /opt/cosigner") for c in copies)
    assert not any("pip install" in rest for word, rest in runtime if word == "RUN")


def test_the_runtime_installs_libatomic_runs_as_non_root_and_checks_health() -> None:
    runtime = stages()[1]
    runs = " ".join(rest for word, rest in runtime if word == "RUN")
    assert re.search(r"apt-get install -y --no-install-recommends [^&]*\blibatomic1\b", runs)
    users = [rest for word, rest in runtime if word == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert runtime.index(("USER", users[-1])) > max(
        i for i, (word, _) in enumerate(runtime) if word in {"RUN", "COPY"})
    health = [rest for word, rest in runtime if word == "HEALTHCHECK"]
    assert len(health) == 1 and "http://127.0.0.1:8080/healthz" in health[0]
    cmd = [rest for word, rest in runtime if word == "CMD"][-1]
    assert "--port" in cmd and "8080" in cmd


def test_the_reference_bundles_are_under_the_documented_path() -> None:
    runtime = stages()[1]
    copies = {tuple(shlex.split(rest)) for word, rest in runtime if word == "COPY"}
    assert ("policies", "/usr/share/cosigner/bundles/policies") in copies
    assert ("rego", "/usr/share/cosigner/bundles/rego") in copies
    env = " ".join(rest for word, rest in runtime if word == "ENV")
    assert ('COSIGNER_BUNDLE_DIRS=\'["/usr/share/cosigner/bundles/policies", '
            '"/usr/share/cosigner/bundles/rego"]\'') in env
    assert "/usr/share/cosigner/bundles" in (ROOT / "README.md").read_text()


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatch(p, pattern[3:]) for p in parts)
        else:
            hit = any(fnmatch.fnmatch(p, pattern) for p in prefixes)
        if hit:
            ignored = not negate
    return ignored


def test_the_build_context_is_only_what_the_image_copies() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    sources = [src for word, rest in instructions() if word == "COPY"
               and not rest.startswith("--from") for src in shlex.split(rest)[:-1]]
    assert sources
    for source in sources:
        assert not _ignored(source, patterns), source
        assert (ROOT / source).exists(), source
    for heavy in (".venv/bin/python", "tests/conftest.py", ".git/HEAD", "var/cosigner.db",
                  "tests/mcp/node_modules/x.js", "cosigner/__pycache__/app.cpython-311.pyc",
                  "clients/python/pyproject.toml", "bench/run.py"):
        assert _ignored(heavy, patterns), heavy


def test_compose_runs_postgres_and_two_replicas_sharing_a_kek() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert services["postgres"]["image"].startswith("postgres:")
    assert "healthcheck" in services["postgres"]
    replicas = {name: s for name, s in services.items() if s.get("build") == "."}
    assert len(replicas) == 2
    keks = {s["environment"]["COSIGNER_KEY_ENCRYPTION_KEY"] for s in replicas.values()}
    assert len(keks) == 1 and next(iter(keks)).startswith("${COSIGNER_KEY_ENCRYPTION_KEY:?")
    for service in replicas.values():
        assert service["environment"]["COSIGNER_DATABASE_URL"].startswith(
            "postgresql+asyncpg://") and "@postgres:5432/" in \
            service["environment"]["COSIGNER_DATABASE_URL"]
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
    ports = [p for s in replicas.values() for p in s["ports"]]
    assert len(set(ports)) == 2


def test_the_makefile_installs_with_the_lock() -> None:
    makefile = (ROOT / "Makefile").read_text()
    installs = re.findall(r"pip install [^\n]*-e [^\n]*", makefile)
    assert len(installs) == 2 and all("-c requirements.lock" in i for i in installs)


def test_the_lock_is_current_and_pins_what_the_tests_run() -> None:
    """requirements.lock == the dependency closure at the versions installed here (the
    test environment); `make lock` regenerates it."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "lock.py")],
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == (ROOT / "requirements.lock").read_text(), (
        "requirements.lock is stale: run `make lock`")
    pins = lock()
    for name in ("fastapi", "regopy", "sqlalchemy", "asyncpg", "uvicorn", "pytest"):
        assert pins[name] == version(name)


def test_the_image_install_step_resolves_to_the_lock(tmp_path: Path) -> None:
    """What ``pip install -c requirements.lock .`` installs in a clean venv (the image's
    build step), resolved without installing: every version is the lock's."""
    for name in ("pyproject.toml", "README.md", "requirements.lock"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "cosigner", tmp_path / "cosigner",
                    ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
         "--quiet", "--report", str(tmp_path / "report.json"), "-c", "requirements.lock",
         "."], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    report = json.loads((tmp_path / "report.json").read_text())
    would = {re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower():
             item["metadata"]["version"] for item in report["install"]}
    pins = lock()
    assert would.pop("cosigner") == "0.1.0"
    assert {"regopy", "fastapi", "asyncpg", "uvicorn"} <= set(would)
    assert "pytest" not in would  # test tools stay out of the image
    assert {name: v for name, v in would.items() if pins.get(name) != v} == {}
