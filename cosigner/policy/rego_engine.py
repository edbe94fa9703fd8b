"""Embedded Rego engine: one ``regopy`` (rego-cpp) interpreter per bundle revision.

Modules are the bundle's ``*.rego`` files (Rego v1 syntax), except ``*_test.rego``,
which only :func:`run_rego_tests` compiles. They are compiled once, at load, into a
``regopy.Bundle`` with the manifest's entrypoint (``Interpreter.build(None,
[entrypoint])``); each evaluation then sets the input and queries the bundle's plan for
the entrypoint (which skips the query parser: ``Interpreter.query`` costs ~4 ms), through
rego-cpp's C API directly (:mod:`cosigner.policy.rego_input`, the same calls regopy
makes, without its per-value ``isinstance`` walk and ``Output`` objects). Only the
top-level input members the modules read are converted (:func:`input_keys`).

Cost (session 7, in process, µs of CPU per evaluation on the 2-core bench machine, the
reference ``rego/refunds`` bundle, allow / require_approval / deny; ``bench/policy_eval.py
--parts``): input ~15–20 (regopy's ``set_input``: ~33–38), query ~50–90 (the policy's
own evaluation; ~100–135 before its rewrite), ``evaluate_sync`` in all ~80 / ~110 / ~80
against ~150 / ~175 / ~140 before. What makes Rego slow in rego-cpp 1.5.2 is written up
in ``rego/refunds/refunds.rego``'s header.

Errors (translated here and nowhere else, STYLE habit 5):

- a module that does not parse or compile → :class:`PolicyError` ``policy_load_failed``
  naming ``file:line:col`` of each error rego-cpp reports;
- an entrypoint whose package and rule no module declares → ``policy_load_failed``
  (rego-cpp would answer "undefined" for ever);
- an evaluation error (conflicting outputs of a complete rule, a builtin error — builtins
  are strict) → :class:`PolicyError` ``policy_error``;
- an undefined result → ``None``, which the store turns into ``deny`` ``undefined``.

rego-cpp 1.5.2 aborts the process on some valid Rego (``with input as`` over a rule that
depends on other rules), so every bundle is first compiled, and queried once with an
empty input, in a child process; only what survived that is compiled in the server.

Results are remembered per engine (one bundle revision, :class:`ResultMemo`) when the
modules are *pure* (:func:`is_pure`: no call of a built-in outside
:data:`PURE_BUILTINS` that reads the clock, randomness, the network or the runtime), so
the entrypoint's value is a function of the members of ``input`` they read: an input
seen before (the same members, key order included, exact JSON types) is answered from
its output text, parsed again (a fresh value each time), without rego-cpp. Errors are
never remembered. Session 13 (bench/README.md): an evaluation is ~85 µs in isolation and
~130 µs of CPU in the server (``bench/hot_cost.py --system allow-rego``: the query ~76,
of which rego-cpp's VM ~70 % and building its output ~25 %; the input ~33); a
remembered one ~3 µs in isolation; allow-rego's request 377 → 251 µs at c=16.

Thread safety: a rego-cpp interpreter holds its input as mutable state, so it is never
shared between threads. ``evaluate`` is a coroutine that runs synchronously on the event
loop thread without awaiting, so on one loop two evaluations cannot interleave; a lock
additionally serializes callers from other threads (e.g. a CLI or a benchmark). The
memo is read and written outside the lock: one ``dict`` lookup or store each, atomic
under the GIL; two threads missing the same input both evaluate it and store equal texts.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any

import regopy

from cosigner.core.errors import PolicyError
from cosigner.core.fastjson import exact_key
from cosigner.policy.rego_input import parse_output, query_entrypoint, set_input
from cosigner.policy.rego_memo import ResultMemo, is_pure, without_comments

_ERROR_RE = re.compile(
    r"\(error \d+:(?P<file>[^|]*)\|(?P<offset>\d+)\|\d+\s*\(errormsg (?P<len>\d+):"
)
_PACKAGE_RE = re.compile(r"^\s*package\s+([\w.]+)", re.MULTILINE)


def entrypoint_path(entrypoint: str) -> tuple[str, str]:
    """Split ``data.a.b.rule`` into (package ``a.b``, rule ``rule``).

    Raises:
        PolicyError: ``policy_load_failed`` when it is not ``data.<package>.<rule>``.
    """
    parts = entrypoint.split(".")
    if len(parts) < 3 or parts[0] != "data" or not all(p.isidentifier() for p in parts[1:]):
        raise PolicyError(
            f"entrypoint {entrypoint!r} must be data.<package>.<rule>", code="policy_load_failed"
        )
    return ".".join(parts[1:-1]), parts[-1]


def _line_col(source: str, offset: int) -> tuple[int, int]:
    before = source.encode()[:offset].decode(errors="replace")
    return before.count("\n") + 1, len(before) - before.rfind("\n")


def describe_rego_error(message: str, sources: dict[str, str]) -> str:
    """Turn a rego-cpp error sequence into ``file:line:col: message`` lines.

    rego-cpp reports ``(error <n>:<file>|<byte offset>|<len> (errormsg <n>:<text>) ...)``;
    the offset is mapped back to a line and column of the named source.
    """
    found: list[str] = []
    for match in _ERROR_RE.finditer(message):
        start = match.end()
        text = message[start : start + int(match["len"])]
        name, offset = match["file"], int(match["offset"])
        if name in sources:
            line, col = _line_col(sources[name], offset)
            found.append(f"{name}:{line}:{col}: {text}")
        else:
            found.append(f"{name or '<query>'}: {text}")
    return "; ".join(dict.fromkeys(found)) or message.strip()


_INPUT_RE = re.compile(r'\binput\b(?:\s*\.\s*(\w+)|\s*\[\s*"(\w+)"\s*\])?')


def input_keys(sources: dict[str, str]) -> frozenset[str] | None:
    """Top-level ``input`` keys the modules read, or ``None`` when any use is opaque.

    Conservative: every ``input`` not followed by ``.key`` or ``["key"]`` (passing the
    whole document on, ``with input as``, ``input[x]``) means the full document.
    """
    keys: set[str] = set()
    for source in sources.values():
        # Comments found as rego-cpp finds them: a ``#`` inside a raw string (which may
        # span lines) starts none, so ``input.args`` after `` `#` `` is read.
        for match in _INPUT_RE.finditer(without_comments(source)):
            key = match.group(1) or match.group(2)
            if key is None:
                return None
            keys.add(key)
    return frozenset(keys)


def _declares_rule(sources: dict[str, str], package: str, rule: str) -> bool:
    head = re.compile(rf"^\s*(default\s+)?{re.escape(rule)}\b", re.MULTILINE)
    for source in sources.values():
        match = _PACKAGE_RE.search(source)
        if match and match.group(1) == package and head.search(source):
            return True
    return False


def _new_interpreter(sources: dict[str, str]) -> regopy.Interpreter:
    interpreter = regopy.Interpreter()
    interpreter.log_level = regopy.LogLevel.NONE  # errors are raised, never printed
    interpreter.strict_built_in_errors = True  # a builtin error is an error, not undefined
    for name, source in sources.items():
        interpreter.add_module(name, source)
    return interpreter


def rego_sources(files: dict[str, bytes], *, where: str, tests: bool = False) -> dict[str, str]:
    """The ``*.rego`` modules of a bundle (``*_test.rego`` only when ``tests``)."""
    sources: dict[str, str] = {}
    for name, raw in sorted(files.items()):
        if not name.endswith(".rego") or (name.endswith("_test.rego") and not tests):
            continue
        try:
            sources[name] = raw.decode()
        except UnicodeDecodeError as exc:
            raise PolicyError(f"{where}/{name}: not UTF-8", code="policy_load_failed") from exc
    return sources


def compile_modules(
    sources: dict[str, str], entrypoints: list[str], *, where: str
) -> tuple[regopy.Interpreter, regopy.Bundle]:
    """Compile ``sources`` with plans for ``entrypoints`` (``a/b/rule`` form).

    Raises:
        PolicyError: ``policy_load_failed`` naming file, line and column.
    """
    try:
        interpreter = _new_interpreter(sources)
        compiled = interpreter.build(None, entrypoints)
    except regopy.RegoError as exc:
        raise PolicyError(
            f"{where}: {describe_rego_error(str(exc), sources)}", code="policy_load_failed"
        ) from exc
    if not compiled.ok():
        raise PolicyError(f"{where}: Rego compilation failed", code="policy_load_failed")
    return interpreter, compiled


class RegoEngine:
    """Evaluate one compiled Rego bundle revision at its entrypoint."""

    def __init__(
        self, *, interpreter: regopy.Interpreter, compiled: regopy.Bundle, entrypoint: str
    ) -> None:
        self._interpreter = interpreter
        self._compiled = compiled
        package, rule = entrypoint_path(entrypoint)
        self._plan = package.replace(".", "/") + "/" + rule
        self._plan_c = self._plan.encode()
        self._lock = threading.Lock()
        self._keys: frozenset[str] | None = None
        #: Set by :meth:`from_files` when the modules are pure and read named members.
        self.memo: ResultMemo | None = None

    @classmethod
    def from_files(cls, files: dict[str, bytes], *, entrypoint: str, where: str) -> RegoEngine:
        """Compile a bundle's modules once; raises :class:`PolicyError` (``policy_load_failed``)."""
        sources = rego_sources(files, where=where)
        if not sources:
            raise PolicyError(f"{where}: no .rego modules", code="policy_load_failed")
        package, rule = entrypoint_path(entrypoint)
        if not _declares_rule(sources, package, rule):
            raise PolicyError(
                f"{where}: no module declares rule '{rule}' in package "
                f"'{package}' (entrypoint {entrypoint})",
                code="policy_load_failed",
            )
        plan = package.replace(".", "/") + "/" + rule
        compile_out_of_process(sources, [plan], where=where, run=[plan])
        interpreter, compiled = compile_modules(sources, [plan], where=where)
        engine = cls(interpreter=interpreter, compiled=compiled, entrypoint=entrypoint)
        engine._keys = input_keys(sources)
        if engine._keys is not None and is_pure(sources):
            engine.memo = ResultMemo()
        return engine

    def evaluate_sync(self, input_doc: dict[str, Any]) -> Any:
        """The entrypoint's value for ``input_doc``, or ``None`` when undefined.

        Raises:
            PolicyError: ``policy_error`` on an evaluation error.
        """
        if self._keys is not None:
            # Only what the modules read: converting the input is a large part of the cost.
            input_doc = {k: input_doc[k] for k in self._keys if k in input_doc}
        memo, key = self.memo, None
        if memo is not None:
            key = exact_key(input_doc)
            if key is not None:
                text = memo.get(key)
                if text is not None:
                    return _value(parse_output(text))
        with self._lock:
            try:
                set_input(self._interpreter, input_doc)
                text = query_entrypoint(self._interpreter, self._compiled, self._plan_c)
            except regopy.RegoError as exc:
                raise PolicyError(f"Rego evaluation failed: {exc}") from exc
        results = None if text is None else parse_output(text)
        value = _value(results)
        if key is not None and memo is not None and text is not None:
            memo.put(key, text)  # after _value: an error is never remembered
        return value

    async def evaluate(self, input_doc: dict[str, Any]) -> Any:
        """Async :meth:`evaluate_sync` (runs inline: it is CPU-bound and ~3–150 µs)."""
        return self.evaluate_sync(input_doc)


def _value(results: list[list[Any]] | None) -> Any:
    """The entrypoint's value of :func:`parse_output`'s ``results`` (see
    :meth:`RegoEngine.evaluate_sync`)."""
    if results is None:
        raise PolicyError(
            "Rego evaluation failed (conflicting rule outputs or a builtin error)"
        )
    if not results or not results[0]:
        return None
    if len(results) > 1 or len(results[0]) > 1:
        raise PolicyError("Rego entrypoint gave more than one value")
    value = results[0][0]
    if value is None:  # a defined null is a wrong shape, not "undefined"
        raise PolicyError("Rego entrypoint is null, not a policy result object")
    return value


@dataclass(frozen=True)
class RegoTestResult:
    name: str  # data.<package>.test_<name>
    passed: bool
    message: str = ""


_TEST_RULE_RE = re.compile(r"^\s*(test_\w+)\b", re.MULTILINE)

# Runs in a child interpreter: compiles the modules and queries each plan with input {}.
# rego-cpp 1.5.2 aborts the whole process on some valid Rego (``with input as`` over a
# rule with dependencies), so untrusted-to-compile sources never meet the server first.
_CHILD = """
import json, sys, regopy
job = json.load(sys.stdin)
it = regopy.Interpreter()
it.log_level = regopy.LogLevel.NONE
it.strict_built_in_errors = True
out = {"error": None, "results": {}}
try:
    for name, source in job["sources"].items():
        it.add_module(name, source)
    bundle = it.build(None, job["plans"])
    it.set_input({})
    for plan in job["run"]:
        o = it.query_bundle_entrypoint(bundle, plan)
        out["results"][plan] = (o.results[0].expressions if o.ok() and o.results else
                                None if o.ok() else "error")
except regopy.RegoError as exc:
    out["error"] = str(exc)
print(json.dumps(out))
"""
CHILD_TIMEOUT_S = 60.0


def compile_out_of_process(
    sources: dict[str, str], plans: list[str], *, where: str, run: list[str] | None = None
) -> dict[str, Any]:
    """Compile (and optionally query) ``sources`` in a child process.

    Returns ``{plan: expressions | None (undefined) | "error"}`` for the plans in ``run``.

    Raises:
        PolicyError: ``policy_load_failed`` on a compile error (file:line:col), a crash
            of rego-cpp (a signal) or a timeout.
    """
    job = json.dumps({"sources": sources, "plans": plans, "run": run or []})
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD],
            input=job,
            text=True,
            capture_output=True,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise PolicyError(
            f"{where}: Rego compilation timed out", code="policy_load_failed"
        ) from exc
    if proc.returncode != 0:
        detail = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise PolicyError(
            f"{where}: rego-cpp crashed compiling the bundle ({detail[0]})",
            code="policy_load_failed",
        )
    out = json.loads(proc.stdout)
    if out["error"] is not None:
        raise PolicyError(
            f"{where}: {describe_rego_error(out['error'], sources)}", code="policy_load_failed"
        )
    results: dict[str, Any] = out["results"]
    return results


def run_rego_tests(files: dict[str, bytes], *, where: str) -> list[RegoTestResult]:
    """Run every ``test_*`` rule of the bundle's ``*_test.rego`` modules, like ``opa test``.

    A test passes when its rule is ``true``; undefined, ``false`` or an evaluation error
    fails it. Runs in a child process (see :func:`compile_out_of_process`). Raises
    :class:`PolicyError` (``policy_load_failed``) if the modules do not compile.
    """
    sources = rego_sources(files, where=where, tests=True)
    plans: dict[str, str] = {}
    for name, source in sources.items():
        if not name.endswith("_test.rego"):
            continue
        package = _PACKAGE_RE.search(source)
        if package is None:
            continue
        for rule in dict.fromkeys(_TEST_RULE_RE.findall(source)):
            plans[package.group(1).replace(".", "/") + "/" + rule] = (
                f"data.{package.group(1)}.{rule}"
            )
    if not plans:
        return []
    outcomes = compile_out_of_process(sources, list(plans), where=where, run=list(plans))
    results: list[RegoTestResult] = []
    for plan, name in plans.items():
        got = outcomes.get(plan)
        if got == [True]:
            results.append(RegoTestResult(name, True))
        elif got == "error":
            results.append(RegoTestResult(name, False, "evaluation error"))
        else:
            results.append(RegoTestResult(name, False, "not true (false or undefined)"))
    return results
