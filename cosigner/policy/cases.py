"""Golden policy cases and Rego ``test_`` rules: a bundle's own tests, like ``opa test``.

A case file (``cases = "cases.yaml"`` in the manifest) is a YAML list::

    - description: refund above the hard limit is denied
      input: {tool: {name: issue_refund}, args: {amount_minor: 250000, ...}}
      want: {effect: deny, reason: over_hard_limit, require: [{role: finance, count: 1}]}

``want.effect`` is required; ``reason`` (a reason code the result must carry) and
``require`` (the exact approval groups) are optional. Missing input fields get defaults
(:data:`DEFAULT_INPUT`), so a case names only what it is about.

A case runs the way a decision does: with a tool catalogue, an unknown tool gives
``deny`` ``unknown_tool`` and invalid arguments give ``deny`` ``invalid_args`` (the API
answers 422; nothing is evaluated); otherwise the bundle is evaluated through
:func:`cosigner.policy.store.run_bundle`, so result validation and fail-closed mapping
apply exactly as in production.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from cosigner.core.errors import InvalidArgs, PolicyError
from cosigner.policy.bundle import Bundle
from cosigner.policy.result import EFFECTS, PolicyResult, deny
from cosigner.policy.store import run_bundle

if TYPE_CHECKING:  # regopy is imported only when a Rego bundle is loaded or tested
    from cosigner.policy.rego_engine import RegoTestResult

T = TypeVar("T")

DEFAULT_INPUT: dict[str, Any] = {
    "tenant": "t",
    "principal": {"id": "user_1", "type": "user"},
    "initiator": {"id": "agent_1", "type": "agent"},
    "caller": {"subject": "runtime_1", "roles": ["runtime"]},
    "tool": {"name": ""},
    "args": {},
    "context": {},
    "run": {"id": "run_1", "step": 1, "tool_calls": 0},
    "now": "2026-01-01T00:00:00Z",
}
_CASE_KEYS = frozenset({"description", "input", "want"})
_WANT_KEYS = frozenset({"effect", "reason", "require"})


@dataclass(frozen=True)
class Case:
    description: str
    input: dict[str, Any]
    effect: str
    reason: str | None = None
    require: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class CaseResult:
    case: Case
    passed: bool
    got: PolicyResult
    message: str = ""


@dataclass
class BundleReport:
    """Everything one bundle's self-test produced."""

    bundle: dict[str, str]
    cases: list[CaseResult] = field(default_factory=list)
    rego_tests: list[RegoTestResult] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        lines = [f"case {r.case.description!r}: {r.message}" for r in self.cases if not r.passed]
        lines += [f"{t.name}: {t.message}" for t in self.rego_tests if not t.passed]
        return lines


def with_defaults(partial: dict[str, Any]) -> dict[str, Any]:
    """A full input document: ``partial`` over :data:`DEFAULT_INPUT` (one level deep)."""
    doc = copy.deepcopy(DEFAULT_INPUT)
    for key, value in partial.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict) and key != "args":
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    return doc


def load_cases(raw: bytes, *, where: str) -> list[Case]:
    """Parse a case file; raises :class:`PolicyError` ``policy_load_failed`` naming it."""
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{where}: invalid YAML: {exc}", code="policy_load_failed") from exc
    if not isinstance(data, list):
        raise PolicyError(f"{where}: must be a list of cases", code="policy_load_failed")
    cases = []
    for index, item in enumerate(data, 1):
        label = f"{where}: case {index}"
        if not isinstance(item, dict) or not set(item) <= _CASE_KEYS or "want" not in item:
            raise PolicyError(f"{label}: needs description, input, want", code="policy_load_failed")
        want = item["want"]
        partial = {} if item.get("input") is None else item["input"]
        if (
            not isinstance(want, dict)
            or not set(want) <= _WANT_KEYS
            or want.get("effect") not in EFFECTS
            or not isinstance(partial, dict)
        ):
            raise PolicyError(
                f"{label}: want needs effect allow|deny|require_approval "
                "(optional reason, require); input must be a mapping",
                code="policy_load_failed",
            )
        cases.append(
            Case(
                description=str(item.get("description") or f"case {index}"),
                input=with_defaults(partial),
                effect=want["effect"],
                reason=want.get("reason"),
                require=want.get("require"),
            )
        )
    return cases


async def evaluate_case(bundle: Bundle, input_doc: dict[str, Any]) -> PolicyResult:
    """Catalogue check, then the bundle, as a decision would run (see module doc)."""
    catalogue = bundle.catalogue
    if catalogue is not None:
        tool = input_doc.get("tool")
        name = tool.get("name") if isinstance(tool, dict) else None
        spec = catalogue.lookup(name) if isinstance(name, str) else None
        if spec is None:
            return deny("unknown_tool", f"{name} is not in the tool catalogue")
        try:
            # jsonschema's answer either way; the compiled validator is built on the
            # first real decision, not at bundle load (idle memory, issue 20).
            spec.validate(input_doc.get("args"), compiled=False)
        except InvalidArgs as exc:
            return deny(
                "invalid_args",
                "; ".join(f"{e['path'] or '/'}: {e['message']}" for e in exc.extra["errors"]),
            )
    return await run_bundle(bundle, input_doc)


def _compare(case: Case, got: PolicyResult) -> str:
    codes = [r.code for r in got.reasons]
    if got.effect != case.effect:
        return f"want effect {case.effect}, got {got.effect} (reasons {codes})"
    if case.reason is not None and case.reason not in codes:
        return f"want reason {case.reason}, got {codes}"
    if case.require is not None:
        have = got.approval.as_dict()["require"] if got.approval else None
        if have != case.require:
            return f"want require {case.require}, got {have}"
    return ""


async def run_cases(bundle: Bundle) -> list[CaseResult]:
    """Run the bundle's case file (none → ``[]``); raises :class:`PolicyError` if malformed."""
    name = bundle.manifest.cases
    if not name:
        return []
    if name not in bundle.files:
        raise PolicyError(f"{bundle.path}/{name}: missing", code="policy_load_failed")
    results = []
    for case in load_cases(bundle.files[name], where=f"{bundle.path}/{name}"):
        got = await evaluate_case(bundle, case.input)
        message = _compare(case, got)
        results.append(CaseResult(case, not message, got, message))
    return results


async def test_bundle(bundle: Bundle) -> BundleReport:
    """Run a bundle's golden cases and, for Rego bundles, its ``test_`` rules."""
    report = BundleReport(bundle=bundle.ref(), cases=await run_cases(bundle))
    if bundle.manifest.engine == "rego":
        from cosigner.policy.rego_engine import run_rego_tests

        report.rego_tests = await asyncio.to_thread(
            run_rego_tests, bundle.files, where=str(bundle.path)
        )
    return report


test_bundle.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from sync code, even when called on a running loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def check_bundle(bundle: Bundle) -> None:
    """``PolicyStore.reload(check=...)`` hook: refuse a bundle that fails its own tests.

    Remote-OPA bundles are not checked at load (their rules live in OPA, which may be
    down during a reload); ``cosigner policy test`` runs their cases.

    Raises:
        PolicyError: ``policy_load_failed`` listing every failing case and test rule.
    """
    if bundle.manifest.engine == "opa":
        return
    report = _run_sync(test_bundle(bundle))
    if report.failures:
        raise PolicyError(
            f"{bundle.path}: {len(report.failures)} failing test(s): " + "; ".join(report.failures),
            code="policy_load_failed",
        )
