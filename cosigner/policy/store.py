"""The policy store: loaded bundle versions, the active one per bundle, evaluation.

Loading is atomic: :meth:`PolicyStore.reload` builds a complete new
:class:`PolicySnapshot` and swaps one reference; a request keeps the snapshot it
started with, so one decision never mixes versions. A bundle that fails to load is
reported in ``snapshot.errors`` and the previously loaded version of it stays.

Evaluation fails closed (DESIGN invariant 1): no bundle for the tenant → ``deny``
``policy_not_loaded``; undefined → ``deny`` ``undefined``; an exception or a result
outside the contract → ``deny`` ``policy_error`` with an error-level log line naming
the bundle.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from cosigner.core import tracing
from cosigner.core.canonical import canonicalize, hash_bytes
from cosigner.core.errors import CosignerError, PolicyError, Unavailable
from cosigner.policy.bundle import Bundle, Engine, parse_manifest, read_files, revision_of
from cosigner.policy.python_engine import PythonEngine
from cosigner.policy.result import PolicyResult, deny, validate_result
from cosigner.policy.state import BundleState, Resolved, resolve

log = logging.getLogger("cosigner.policy")
_NO_SPAN = contextlib.nullcontext()


#: Tenants whose routed bundle one snapshot remembers (:meth:`PolicySnapshot.bundle_for`).
_MAX_ROUTES = 10_000


@dataclass(frozen=True)
class LoadError:
    path: str
    message: str
    bundle_id: str | None = None
    version: str | None = None


class Evaluation(NamedTuple):
    """What one policy evaluation produced.

    ``policy`` is ``{id, version, revision}`` of the bundle that decided, or ``None``
    when no bundle applies. ``shadow`` is the shadow version's result (never acted on).
    """

    result: PolicyResult
    policy: dict[str, str] | None
    bundle: Bundle | None
    shadow: PolicyResult | None = None
    shadow_policy: dict[str, str] | None = None
    #: Microseconds the active bundle took: at least 1 when it ran, 0 when no policy ran.
    elapsed_us: int = 0
    #: Remote OPA: the bundle revisions OPA reported for this evaluation (recorded in the
    #: decision event; ``policy.revision`` already digests them).
    opa_revisions: dict[str, str] | None = None


@dataclass(frozen=True)
class PolicySnapshot:
    """An immutable view: every loaded version, the active and shadow version per id."""

    bundles: dict[str, dict[str, Bundle]] = field(default_factory=dict)
    active: dict[str, str] = field(default_factory=dict)
    shadow: dict[str, str] = field(default_factory=dict)
    errors: tuple[LoadError, ...] = ()
    tenant_bundles: dict[str, str] = field(default_factory=dict)
    #: bundle id → tenants of its stored active version, which is not loaded here
    #: (:mod:`cosigner.policy.state`): those tenants are denied ``policy_not_loaded``.
    missing: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: tenant → :meth:`bundle_for`, filled on first use (a snapshot never changes; a
    #: change is a new snapshot). At most :data:`_MAX_ROUTES` tenants are kept.
    _routed: dict[str, Bundle | None] = field(default_factory=dict, compare=False,
                                              repr=False)

    def active_bundle(self, bundle_id: str) -> Bundle | None:
        version = self.active.get(bundle_id)
        return self.bundles.get(bundle_id, {}).get(version) if version else None

    def shadow_bundle(self, bundle_id: str) -> Bundle | None:
        version = self.shadow.get(bundle_id)
        return self.bundles.get(bundle_id, {}).get(version) if version else None

    def tenants_of(self, bundle_id: str) -> tuple[str, ...]:
        """Tenants the active version of ``bundle_id`` names (a missing one: as stored)."""
        bundle = self.active_bundle(bundle_id)
        if bundle is not None:
            return bundle.manifest.tenants
        return self.missing.get(bundle_id, ())

    def route(self, tenant: str) -> str | None:
        """The id of the bundle that decides for ``tenant``: an explicit mapping in
        settings first, then a bundle whose manifest names the tenant, then a ``"*"``
        bundle (first by id). A bundle whose active version is missing still routes, so
        its tenants are denied rather than decided by another bundle."""
        mapped = self.tenant_bundles.get(tenant)
        if mapped is not None:
            return mapped
        wildcard = None
        ids = sorted(set(self.active) | set(self.missing)) if self.missing else sorted(self.active)
        for bundle_id in ids:
            tenants = self.tenants_of(bundle_id)
            if tenant in tenants:
                return bundle_id
            if wildcard is None and "*" in tenants:
                wildcard = bundle_id
        return wildcard

    def bundle_for(self, tenant: str) -> Bundle | None:
        """The active bundle used by ``tenant`` (:meth:`route`), or ``None``."""
        routed = self._routed
        if tenant in routed:
            return routed[tenant]
        bundle_id = self.route(tenant)
        bundle = self.active_bundle(bundle_id) if bundle_id is not None else None
        if len(routed) < _MAX_ROUTES:
            routed[tenant] = bundle
        return bundle


def _manifest_id(path: Path) -> tuple[str | None, str | None]:
    """``(id, version)`` of a refused bundle folder when its manifest parses."""
    try:
        manifest = parse_manifest((path / "manifest.toml").read_bytes(), where=str(path))
    except (OSError, PolicyError):
        return None, None
    return manifest.id, manifest.version


def newest_version(versions: Any) -> str:
    """The newest of ``versions`` (version strings, or a dict keyed by them)."""
    return str(max(versions, key=_version_key))


def _version_key(version: str) -> tuple[Any, ...]:
    parts: list[Any] = []
    for piece in version.replace("-", ".").split("."):
        parts.append((0, int(piece), "") if piece.isdigit() else (1, 0, piece))
    return tuple(parts)


class PolicyStore:
    """Holds the current :class:`PolicySnapshot` and evaluates decisions against it."""

    def __init__(
        self,
        bundle_dirs: list[Path],
        *,
        tenant_bundles: dict[str, str] | None = None,
        engine_factory: Any = None,
        managed: bool = False,
    ) -> None:
        """``managed``: the active and shadow versions come from the stored policy state
        (:meth:`install`); until one is installed nothing is active (fail closed).
        Unmanaged (tools, unit tests): the newest version of each bundle is active."""
        self.bundle_dirs = list(bundle_dirs)
        self.snapshot = PolicySnapshot(tenant_bundles=dict(tenant_bundles or {}))
        self._engine_factory = engine_factory or build_engine
        self.managed = managed
        self.state: dict[str, BundleState] | None = None

    # -- loading -----------------------------------------------------------------------

    def load_bundle(self, path: Path) -> Bundle:
        """Read, compile and self-test one bundle folder; raises :class:`PolicyError`."""
        files = read_files(path)
        if "manifest.toml" not in files:
            raise PolicyError(f"{path}/manifest.toml: missing", code="policy_load_failed")
        manifest = parse_manifest(files["manifest.toml"], where=f"{path}/manifest.toml")
        revision = revision_of(files)
        engine = self._engine_factory(manifest=manifest, path=path, files=files,
                                      revision=revision)
        bundle = Bundle(manifest=manifest, path=path, revision=revision, engine=engine,
                        files=files)
        if manifest.catalogue:
            from cosigner.policy.catalogue import load_catalogue

            bundle.catalogue = load_catalogue(files, manifest.catalogue, where=str(path))
        return bundle

    def discover(self) -> list[Path]:
        """Bundle folders (those with a manifest.toml) under the configured dirs."""
        found: list[Path] = []
        for root in self.bundle_dirs:
            if root.is_dir():
                found.extend(sorted(p.parent for p in root.glob("*/manifest.toml")))
        return found

    def reload(self, *, check: Any = None) -> PolicySnapshot:
        """Load every bundle folder and swap in a new snapshot atomically.

        ``check(bundle)`` (optional) runs the bundle's own test cases and raises
        :class:`PolicyError` on failure. A refused bundle keeps its previously loaded
        versions active. Returns the new snapshot; its ``errors`` list what was refused.
        """
        old = self.snapshot
        bundles: dict[str, dict[str, Bundle]] = {}
        errors: list[LoadError] = []
        for path in self.discover():
            try:
                bundle = self.load_bundle(path)
                if check is not None:
                    check(bundle)
            except PolicyError as exc:
                log.error("policy bundle refused: %s", exc.detail)
                bundle_id, version = _manifest_id(path)
                errors.append(LoadError(str(path), exc.detail, bundle_id, version))
                continue
            versions = bundles.setdefault(bundle.id, {})
            if bundle.version in versions:
                errors.append(LoadError(str(path), f"duplicate version {bundle.version}",
                                        bundle.id, bundle.version))
                continue
            versions[bundle.version] = bundle
        # A refused bundle keeps the versions it had.
        for bundle_id, versions in old.bundles.items():
            if any(e.path in {str(b.path) for b in versions.values()} for e in errors):
                merged = bundles.setdefault(bundle_id, {})
                for version, bundle in versions.items():
                    merged.setdefault(version, bundle)
        self.snapshot = self._resolved(bundles, tuple(errors), old)
        return self.snapshot

    def install(self, state: dict[str, BundleState]) -> PolicySnapshot:
        """Decide from now on with the stored ``state`` (:mod:`cosigner.policy.state`),
        keeping the loaded bundles; one atomic swap."""
        self.state = dict(state)
        self.snapshot = self.preview(state)
        return self.snapshot

    def preview(self, state: dict[str, BundleState]) -> PolicySnapshot:
        """The snapshot :meth:`install` would make of ``state`` (nothing swapped)."""
        old = self.snapshot
        return self._resolved(old.bundles, old.errors, old, state)

    def _resolved(self, bundles: dict[str, dict[str, Bundle]],
                  errors: tuple[LoadError, ...], old: PolicySnapshot,
                  state: dict[str, BundleState] | None = None) -> PolicySnapshot:
        if self.managed:
            state = state if state is not None else self.state
            present = set(bundles) | {e.bundle_id for e in errors if e.bundle_id}
            chosen = resolve(bundles, present, state, newest_version) \
                if state is not None else Resolved({}, {}, {})
            return PolicySnapshot(bundles, chosen.active, chosen.shadow, errors,
                                  old.tenant_bundles, chosen.missing)
        active: dict[str, str] = {}
        for bundle_id, versions in bundles.items():
            previous = old.active.get(bundle_id)
            active[bundle_id] = previous if previous in versions else newest_version(versions)
        shadow = {
            bid: v for bid, v in old.shadow.items()
            if v in bundles.get(bid, {}) and active.get(bid) != v
        }
        return PolicySnapshot(bundles, active, shadow, errors, old.tenant_bundles)

    def set_active(self, bundle_id: str, version: str) -> None:
        """Make ``version`` the active one of ``bundle_id`` (atomic swap), in this process
        only: administration stores it first (:mod:`cosigner.policy.admin`)."""
        snap = self.snapshot
        if version not in snap.bundles.get(bundle_id, {}):
            raise PolicyError(f"bundle {bundle_id} has no loaded version {version}",
                              code="unknown_policy_version")
        active = dict(snap.active, **{bundle_id: version})
        shadow = {k: v for k, v in snap.shadow.items() if not (k == bundle_id and v == version)}
        missing = {k: v for k, v in snap.missing.items() if k != bundle_id}
        self.snapshot = PolicySnapshot(snap.bundles, active, shadow, snap.errors,
                                       snap.tenant_bundles, missing)

    def set_shadow(self, bundle_id: str, version: str | None) -> None:
        """Run ``version`` of ``bundle_id`` in shadow (``None`` stops shadowing), in this
        process only (see :meth:`set_active`)."""
        snap = self.snapshot
        shadow = dict(snap.shadow)
        if version is None:
            shadow.pop(bundle_id, None)
        elif version not in snap.bundles.get(bundle_id, {}):
            raise PolicyError(f"bundle {bundle_id} has no loaded version {version}",
                              code="unknown_policy_version")
        else:
            shadow[bundle_id] = version
        self.snapshot = PolicySnapshot(snap.bundles, snap.active, shadow, snap.errors,
                                       snap.tenant_bundles, snap.missing)

    @property
    def ready(self) -> bool:
        return bool(self.snapshot.active)

    # -- evaluation ----------------------------------------------------------------------

    async def evaluate(self, tenant: str, input_doc: dict[str, Any],
                       *, snapshot: PolicySnapshot | None = None) -> Evaluation:
        """Evaluate the tenant's active bundle (and its shadow) on ``input_doc``.

        Never raises for policy faults: they become ``deny`` results. Raises
        :class:`cosigner.core.errors.Unavailable` only for ``engine_unavailable`` faults that
        the engine itself marks as such (the caller still records a deny).
        """
        snap = snapshot or self.snapshot
        bundle = snap.bundle_for(tenant)
        if bundle is None:
            routed = snap.route(tenant)
            detail = (f"the active version of policy bundle {routed} is not loaded on this "
                      "server" if routed in snap.missing
                      else "no policy bundle is loaded for this tenant")
            return Evaluation(deny("policy_not_loaded", detail), None, None)
        # Off, no span: its attributes are not even built.
        with (tracing.span("policy.evaluate", {"cosigner.bundle": bundle.id,
                                               "cosigner.bundle.version": bundle.version,
                                               "cosigner.engine": bundle.manifest.engine})
              if tracing.enabled() else _NO_SPAN) as current:
            started = time.perf_counter()
            engine = bundle.engine
            result, ref, opa = (run_python_traced(bundle, engine, input_doc)
                                if type(engine) is _AsyncPython
                                else await run_bundle_traced(bundle, input_doc))
            # At least 1: 0 means no policy ran (cosigner.decisions.pdp), and a Python
            # rule evaluated without awaiting can finish within one microsecond.
            elapsed = max(1, int((time.perf_counter() - started) * 1e6))
            tracing.set_attributes(current, {"cosigner.effect": result.effect})
        shadow_bundle = snap.shadow_bundle(bundle.id)
        shadow, shadow_ref = None, None
        if shadow_bundle is not None:
            shadow, shadow_ref, _ = await run_bundle_traced(shadow_bundle, input_doc)
        return Evaluation(result, ref, bundle, shadow, shadow_ref, elapsed, opa)


def evaluated_ref(bundle: Bundle, opa_revisions: dict[str, str] | None) -> dict[str, str]:
    """The ``{id, version, revision}`` of what was evaluated: the bundle's own digest, or
    for a remote OPA that reported revisions, ``sha256`` over the canonical JSON of
    ``{"bundle": <digest>, "opa": {name: revision}}`` (a change inside OPA changes it)."""
    ref = bundle.ref()
    if opa_revisions:
        ref["revision"] = hash_bytes(canonicalize(
            {"bundle": bundle.revision, "opa": opa_revisions}))
    return ref


async def run_bundle(bundle: Bundle, input_doc: dict[str, Any]) -> PolicyResult:
    """Evaluate one bundle and validate the result; every fault becomes a ``deny``."""
    return (await run_bundle_traced(bundle, input_doc))[0]


async def run_bundle_traced(bundle: Bundle, input_doc: dict[str, Any]
                            ) -> tuple[PolicyResult, dict[str, str], dict[str, str] | None]:
    """``(result, policy ref, OPA revisions)`` of one evaluation (:func:`run_bundle`,
    :func:`evaluated_ref`)."""
    engine = bundle.engine
    if type(engine) is _AsyncPython:  # nothing to await: no coroutine per evaluation
        return run_python_traced(bundle, engine, input_doc)
    revisions: dict[str, str] | None = None
    traced = getattr(engine, "evaluate_traced", None)
    try:
        if traced is not None:
            raw, revisions = await traced(input_doc)
        else:
            raw = await engine.evaluate(input_doc)
        result = _validated(bundle, raw)
    except Exception as exc:  # noqa: BLE001 - every fault becomes a deny (_fault)
        return _fault(bundle, exc), bundle.ref(), None
    return result, evaluated_ref(bundle, revisions), revisions


def run_python_traced(bundle: Bundle, engine: _AsyncPython, input_doc: dict[str, Any]
                      ) -> tuple[PolicyResult, dict[str, str], None]:
    """:func:`run_bundle_traced` of a bundle whose ``engine`` is the Python one, called
    without awaiting (its rules run on the event loop either way)."""
    try:
        result = _validated(bundle, engine.python.evaluate(input_doc))
    except Exception as exc:  # noqa: BLE001 - every fault becomes a deny (_fault)
        return _fault(bundle, exc), bundle.ref(), None
    return result, evaluated_ref(bundle, None), None


def _fault(bundle: Bundle, exc: Exception) -> PolicyResult:
    """The deny of an evaluation that raised ``exc``, logged."""
    if isinstance(exc, Unavailable):
        log.error("policy engine unavailable for bundle %s@%s: %s", bundle.id,
                  bundle.version, exc.detail)
        return deny(exc.code, exc.detail)
    if isinstance(exc, CosignerError):
        log.error("policy error in bundle %s@%s: %s", bundle.id, bundle.version, exc.detail)
        return deny(exc.code if exc.code in {"undefined", "policy_error"} else "policy_error",
                    exc.detail)
    # Rule code is operator-written: any fault denies. The exception's text may quote
    # argument values (never logged, invariant 10): its type and where the rule raised
    # it are what the operator needs.
    where = traceback.extract_tb(exc.__traceback__)[-1]
    log.error("policy rule raised in bundle %s@%s: %s at %s:%s", bundle.id,
              bundle.version, type(exc).__name__, Path(where.filename).name, where.lineno)
    return deny("policy_error", f"rule raised {type(exc).__name__}")


def _validated(bundle: Bundle, raw: Any) -> PolicyResult:
    if raw is None:
        return deny("undefined", "the policy gave no decision for this input")
    try:
        return validate_result(raw)
    except PolicyError as exc:
        log.error("malformed policy result from bundle %s@%s: %s", bundle.id,
                  bundle.version, exc.detail)
        return deny("policy_error", exc.detail)


class _AsyncPython:
    """The :class:`Engine` face of a :class:`PythonEngine` (``python``)."""

    def __init__(self, engine: PythonEngine) -> None:
        self.python = engine

    async def evaluate(self, input_doc: dict[str, Any]) -> Any:
        return self.python.evaluate(input_doc)


def build_engine(*, manifest: Any, path: Path, files: dict[str, bytes], revision: str,
                 opa_url: str = "http://127.0.0.1:8181", opa_timeout_ms: int = 500) -> Engine:
    """Compile the engine a manifest names; raises :class:`PolicyError` on failure.

    ``opa_url`` / ``opa_timeout_ms`` apply to ``engine = "opa"`` bundles only.
    """
    if manifest.engine == "python":
        if "rules.py" not in files:
            raise PolicyError(f"{path}/rules.py: missing", code="policy_load_failed")
        name = f"cosigner_bundle_{manifest.id}_{revision[7:19]}".replace("-", "_")
        return _AsyncPython(PythonEngine(source=files["rules.py"],
                                         entrypoint=manifest.entrypoint,
                                         module_name=name, filename=str(path / "rules.py")))
    if manifest.engine == "rego":
        from cosigner.policy.rego_engine import RegoEngine

        return RegoEngine.from_files(files, entrypoint=manifest.entrypoint, where=str(path))
    if manifest.engine == "opa":
        from cosigner.policy.opa_engine import OpaEngine

        return OpaEngine.from_manifest(manifest, url=opa_url, timeout_ms=opa_timeout_ms)
    raise PolicyError(f"{path}: unknown engine {manifest.engine}", code="policy_load_failed")


def engine_factory(*, opa_url: str, opa_timeout_ms: int) -> Any:
    """A :func:`build_engine` bound to the remote-OPA settings, for ``PolicyStore``."""
    return functools.partial(build_engine, opa_url=opa_url, opa_timeout_ms=opa_timeout_ms)
