"""Policy bundles on disk: manifest, revision digest, engine construction.

A bundle is a folder holding ``manifest.toml`` plus either ``rules.py`` (Python rules)
or ``*.rego`` files. Its revision is the SHA-256 over every file's relative path and
bytes, so a silent edit shows in every decision record (DESIGN § Policies).

manifest.toml::

    id = "refunds"                 # bundle id, stable across versions
    version = "1.0.0"
    engine = "python"              # python | rego | opa
    entrypoint = "decide"          # python: function in rules.py; rego/opa: data.<path>
    tenants = ["*"]                # tenants that use it; "*" = every tenant without its own
    cases = "cases.yaml"           # optional golden cases (description / input / want)
    [opa]                          # engine = "opa" only: which OPA bundle serves the rule
    bundle = "refunds"             # its revision (OPA provenance) goes into every record
    require_revision = true        # deny policy_error when OPA does not report it
    [review]                       # optional: requirement for runtime-requested reviews
    require = [{ role = "finance", count = 1 }]
    timeout_ms = 1800000
    distinct_from = "initiator_and_previous"
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cosigner.core.errors import PolicyError
from cosigner.policy.result import ApprovalRequirement, parse_requirement

_IGNORED_DIRS = {"__pycache__", ".pytest_cache"}
_MANIFEST_KEYS = {"id", "version", "engine", "entrypoint", "tenants", "cases", "review",
                  "catalogue", "shadow_of", "description", "opa"}
_OPA_KEYS = {"bundle", "require_revision"}


class Engine(Protocol):
    """An evaluator of one compiled bundle revision.

    ``evaluate`` returns the raw rule result (``None`` when undefined) or raises; the
    store validates it. Implementations must be safe to call from one event-loop thread.
    """

    async def evaluate(self, input_doc: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class Manifest:
    id: str
    version: str
    engine: str
    entrypoint: str
    tenants: tuple[str, ...]
    cases: str | None = None
    review: ApprovalRequirement | None = None
    catalogue: str | None = None
    #: ``engine = "opa"``: the OPA bundle whose revision is recorded (``None``: every
    #: bundle OPA reports), and whether a decision needs it (else ``policy_error``).
    opa_bundle: str | None = None
    opa_require_revision: bool = False


@dataclass
class Bundle:
    """One loaded, compiled bundle version."""

    manifest: Manifest
    path: Path
    revision: str
    engine: Engine
    catalogue: Any = None  # cosigner.policy.catalogue.ToolCatalogue when the bundle has one
    files: dict[str, bytes] = field(default_factory=dict, repr=False)

    @property
    def id(self) -> str:
        return self.manifest.id

    @property
    def version(self) -> str:
        return self.manifest.version

    def ref(self) -> dict[str, str]:
        """``{id, version, revision}`` as recorded in decisions, events and permits."""
        return {"id": self.manifest.id, "version": self.manifest.version,
                "revision": self.revision}


def read_files(path: Path) -> dict[str, bytes]:
    """Every regular file of a bundle folder, keyed by POSIX relative path."""
    files: dict[str, bytes] = {}
    for file in sorted(path.rglob("*")):
        rel = file.relative_to(path)
        if any(part in _IGNORED_DIRS or part.startswith(".") for part in rel.parts):
            continue
        if file.is_file():
            files[rel.as_posix()] = file.read_bytes()
    return files


def revision_of(files: dict[str, bytes]) -> str:
    """``sha256:<hex>`` over (path length, path, content length, content) of each file."""
    digest = hashlib.sha256()
    for name in sorted(files):
        encoded = name.encode()
        digest.update(len(encoded).to_bytes(8, "big") + encoded)
        digest.update(len(files[name]).to_bytes(8, "big") + files[name])
    return "sha256:" + digest.hexdigest()


def parse_manifest(raw: bytes, *, where: str) -> Manifest:
    """Parse and validate ``manifest.toml``; raises :class:`PolicyError` naming the file."""
    try:
        data = tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"{where}: {exc}", code="policy_load_failed") from exc
    unknown = set(data) - _MANIFEST_KEYS
    if unknown:
        raise PolicyError(f"{where}: unknown keys {sorted(unknown)}", code="policy_load_failed")
    for key in ("id", "version", "engine", "entrypoint"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise PolicyError(f"{where}: '{key}' must be a non-empty string",
                              code="policy_load_failed")
    if data["engine"] not in ("python", "rego", "opa"):
        raise PolicyError(f"{where}: engine must be python, rego or opa",
                          code="policy_load_failed")
    tenants = data.get("tenants", [])
    if not isinstance(tenants, list) or not tenants or not all(
        isinstance(t, str) and t for t in tenants
    ):
        raise PolicyError(f"{where}: 'tenants' must be a non-empty list of tenant ids",
                          code="policy_load_failed")
    review = None
    if "review" in data:
        try:
            review = parse_requirement(data["review"])
        except PolicyError as exc:
            raise PolicyError(f"{where}: [review] {exc.detail}",
                              code="policy_load_failed") from exc
    opa = data.get("opa", {})
    if "opa" in data and data["engine"] != "opa":
        raise PolicyError(f"{where}: [opa] is for engine = \"opa\" only",
                          code="policy_load_failed")
    if (not isinstance(opa, dict) or not set(opa) <= _OPA_KEYS
            or not isinstance(opa.get("bundle", ""), str)
            or not isinstance(opa.get("require_revision", False), bool)):
        raise PolicyError(f"{where}: [opa] takes bundle (a string) and require_revision "
                          "(a boolean)", code="policy_load_failed")
    return Manifest(
        id=data["id"], version=data["version"], engine=data["engine"],
        entrypoint=data["entrypoint"], tenants=tuple(tenants), cases=data.get("cases"),
        review=review, catalogue=data.get("catalogue"),
        opa_bundle=opa.get("bundle") or None,
        opa_require_revision=opa.get("require_revision", False),
    )
