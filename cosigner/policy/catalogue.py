"""Tool catalogue: per tool, a JSON Schema for its arguments, a side-effect class, masks.

``tools.yaml`` in a bundle (named by ``catalogue = "tools.yaml"`` in the manifest)::

    tools:
      issue_refund:
        side_effect: financial          # none | read | write | financial | destructive
        mask: ["/order_id"]             # JSON pointers (RFC 6901) to redact in records
        schema:                         # JSON Schema draft 2020-12 for the arguments
          type: object
          ...

A property may carry display hints for the approver pages (``x-cosigner-display``, e.g. an
amount in minor units with the pointer of its currency field); they change nothing about
validation and are checked at load (:mod:`cosigner.policy.display`)::

        amount_minor:
          type: integer
          x-cosigner-display: {format: money, currency_field: /currency}

Arguments are validated before any policy runs (DESIGN § Policies): a violation is
:class:`InvalidArgs` (422 ``invalid_args``) listing every error; a tool the catalogue does
not name is denied ``unknown_tool`` by the caller (:meth:`ToolCatalogue.lookup` → ``None``).

``"type": "integer"`` is strict here: JSON Schema counts ``100000.0`` as an integer and
Python counts ``True`` as one; neither is accepted (case K25). Only a JSON integer is.
``pattern`` follows ECMA-262 as JSON Schema says: ``$`` is the end of the string.

Validation is two-tier (issue 20): a compiled validator (``jsonschema-rs``, Rust; ~0.5 µs
instead of 25–40 µs) answers *valid* for arguments holding no float; everything else —
any argument it refuses, and any argument holding a float, where its non-strict
``integer`` would differ — goes to the ``jsonschema`` validator above, which decides and
words every error. So the answer and the errors are ``jsonschema``'s by construction; a
hypothesis test (tests/policy/test_catalogue_compiled.py) checks that the compiled
validator accepts exactly what ``jsonschema`` accepts on the catalogue schemas. The
compiled validator is built (and ``jsonschema-rs`` imported, ~6.5 MB resident with the
compiled schema) on a tool's first validation, not at load (:class:`CompiledOnFirstUse`):
an idle server that never validates holds neither (issue 20, idle memory).
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from cosigner.core.errors import InvalidArgs, PolicyError
from cosigner.policy.display import DisplayHint, HintError, hints_of

SIDE_EFFECTS = frozenset({"none", "read", "write", "financial", "destructive"})
_TOOL_KEYS = frozenset({"schema", "side_effect", "mask", "description"})


def _strict_integer(checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


#: ECMA-262's ASCII-only classes (Python's ``\d`` and ``\w`` also match other scripts'
#: digits and letters, so "0" + U+0660 would pass ``\d{2}``), outside and inside ``[...]``.
_ECMA_CLASSES = {"d": "[0-9]", "D": "[^0-9]", "w": "[A-Za-z0-9_]", "W": "[^A-Za-z0-9_]"}
_ECMA_IN_CLASS = {"d": "0-9", "D": r"\x00-/:-\U0010ffff", "w": "A-Za-z0-9_",
                  "W": r"\x00-/:-@\[-\^`{-\U0010ffff"}


def ecma_pattern(pattern: str) -> str:
    """``pattern`` with ECMA-262 semantics where Python's differ: ``$`` is the end of
    input only (Python's ``$`` also matches before a trailing newline, so ``"ord_1\\n"``
    would pass ``^ord_[0-9]+$``), and ``\\d \\D \\w \\W`` are ASCII classes (ECMA-262
    §22.2.2.9; ``\\s`` and ``\\b`` are left as Python's, which jsonschema-rs matches)."""
    out: list[str] = []
    escaped = in_class = after_set = False
    dash = -1  # where in out the last unescaped "-" inside a class went
    for char in pattern:
        follows_set, after_set = after_set, False
        if escaped:
            escaped = False
            if char in _ECMA_CLASSES:
                out[-1] = (_ECMA_IN_CLASS if in_class else _ECMA_CLASSES)[char]
                if in_class:
                    # ECMA-262 B.1.2: a "-" beside a class escape is a literal "-"; beside
                    # the expansion, Python would read a range ("[\\w-z]", "[+-\\d]").
                    if dash == len(out) - 2:
                        out[dash] = r"\-"
                    after_set = True
                continue
        elif char == "\\":
            escaped = True
        elif char == "[":
            in_class = True
        elif char == "]":
            in_class = False
        elif char == "-" and in_class:
            dash = len(out)
            if follows_set:
                out.append(r"\-")
                continue
        elif char == "$" and not in_class:
            out.append(r"\Z")
            continue
        out.append(char)
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(ecma_pattern(pattern))


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if isinstance(instance, str) and not _compiled(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


_TYPE_CHECKER = Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer)
StrictValidator = jsonschema.validators.extend(
    Draft202012Validator, validators={"pattern": _pattern}, type_checker=_TYPE_CHECKER
)


def compiled_validator(schema: dict[str, Any]) -> Any | None:
    """A ``jsonschema-rs`` draft 2020-12 validator of ``schema`` (formats not asserted, as
    in ``jsonschema``; never fetching remote references), or ``None`` when it cannot
    build one (then ``jsonschema`` alone validates)."""
    try:
        import jsonschema_rs

        return jsonschema_rs.Draft202012Validator(schema, validate_formats=False, offline=True)
    except Exception:  # noqa: BLE001 - any refusal means: use jsonschema only
        return None


def _never_valid(instance: Any) -> bool:
    return False


class CompiledOnFirstUse:
    """:func:`compiled_validator` of ``schema``, built on the first :meth:`is_valid` call.

    Thread-safe: the first callers wait on one lock and one of them builds it; from then on
    ``is_valid`` is the compiled validator's own bound method (an instance attribute
    shadowing this class's method), so the hot path pays nothing for the laziness. Where
    no compiled validator can be built, ``is_valid`` answers ``False`` for everything, so
    ``jsonschema`` alone decides (as for a ``None`` compiled validator).
    """

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self._schema = schema
        self._lock = threading.Lock()

    def is_valid(self, instance: Any) -> bool:  # replaced by the built validator's
        with self._lock:
            if "is_valid" not in self.__dict__:
                compiled = compiled_validator(dict(self._schema))
                self.is_valid = (  # type: ignore[method-assign]
                    _never_valid if compiled is None else compiled.is_valid)
        return bool(self.is_valid(instance))


def _no_float(value: Any) -> bool:
    """True when ``value`` (parsed JSON) holds no float anywhere (scalar members checked
    in the loop, containers by recursion: no generator per container)."""
    t = type(value)
    if t is dict:
        items = value.values()
    elif t is list:
        items = value
    else:
        return t is not float
    for item in items:
        t = type(item)
        if t is float or ((t is dict or t is list) and not _no_float(item)):
            return False
    return True


def _pointer(path: Any) -> str:
    """RFC 6901 JSON pointer of a jsonschema error path."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


@dataclass(frozen=True)
class ToolSpec:
    """One catalogue entry; ``validate`` uses a validator built once at load."""

    name: str
    side_effect: str
    mask: tuple[str, ...]
    schema: Mapping[str, Any]
    _validator: Any = field(repr=False, compare=False)
    #: Display hints of the approver pages: argument pointer → hint (may be empty).
    display: Mapping[str, DisplayHint] = field(default_factory=dict, compare=False)
    _compiled: Any = field(default=None, repr=False, compare=False)

    def validate(self, args: Any, *, compiled: bool = True) -> None:
        """Check ``args`` against the tool's schema. ``compiled=False`` skips the compiled
        validator (the answer and errors are ``jsonschema``'s either way): the golden cases
        run at bundle load use it, so loading a bundle does not build it.

        Raises:
            InvalidArgs: ``invalid_args`` with ``extra["errors"] = [{"path", "message"}]``,
                one per violation, in a stable order (path, then message).
        """
        fast = self._compiled if compiled else None
        if fast is not None and fast.is_valid(args) and _no_float(args):
            return  # valid for jsonschema too (module docstring)
        errors = [
            {"path": _pointer(error.absolute_path), "message": error.message}
            for error in self._validator.iter_errors(args)
        ]
        if errors:
            errors.sort(key=lambda e: (e["path"], e["message"]))
            raise InvalidArgs(
                f"arguments of {self.name} do not match its schema", tool=self.name, errors=errors
            )


@dataclass(frozen=True)
class ToolCatalogue:
    tools: Mapping[str, ToolSpec]

    def lookup(self, name: str) -> ToolSpec | None:
        """The tool's spec, or ``None`` when the catalogue does not name it."""
        return self.tools.get(name)


def describe_tools(bundle: Any) -> dict[str, Any]:
    """What a runtime may learn of its tenant's active bundle (``GET /v1/tools``).

    ``{"policy": {id, version, revision} | None, "tools": [{name, side_effect}] | None}``:
    ``policy`` is ``None`` when no bundle serves the tenant (every call is denied);
    ``tools`` is ``None`` when the bundle has no catalogue (any name may be evaluated).
    A tool missing from a non-null list is denied ``unknown_tool`` whatever its arguments.
    Schemas and masks are not disclosed.
    """
    if bundle is None:
        return {"policy": None, "tools": None}
    catalogue = bundle.catalogue
    tools = None if catalogue is None else [
        {"name": spec.name, "side_effect": spec.side_effect}
        for spec in sorted(catalogue.tools.values(), key=lambda s: s.name)]
    return {"policy": bundle.ref(), "tools": tools}


def _fail(where: str, message: str) -> PolicyError:
    return PolicyError(f"{where}: {message}", code="policy_load_failed")


def _parse_tool(name: str, raw: Any, where: str) -> ToolSpec:
    if not isinstance(raw, dict) or not set(raw) <= _TOOL_KEYS or "schema" not in raw:
        raise _fail(where, f"tool {name!r} must be a mapping with schema, side_effect, mask")
    side_effect = raw.get("side_effect")
    if side_effect not in SIDE_EFFECTS:
        raise _fail(where, f"tool {name!r}: side_effect must be one of {sorted(SIDE_EFFECTS)}")
    mask = raw.get("mask", [])
    if not isinstance(mask, list) or not all(
        isinstance(p, str) and p.startswith("/") for p in mask
    ):
        raise _fail(where, f"tool {name!r}: mask must be a list of JSON pointers")
    schema = raw["schema"]
    if not isinstance(schema, dict):
        raise _fail(where, f"tool {name!r}: schema must be a mapping")
    try:
        StrictValidator.check_schema(schema)
    except SchemaError as exc:
        raise _fail(
            where,
            f"tool {name!r}: invalid JSON Schema at "
            f"{_pointer(exc.absolute_path) or '/'}: {exc.message}",
        ) from exc
    try:
        display = hints_of(schema)
    except HintError as exc:
        raise _fail(where, f"tool {name!r}: {exc}") from exc
    return ToolSpec(
        name=name,
        side_effect=side_effect,
        mask=tuple(mask),
        schema=schema,
        _validator=StrictValidator(schema),
        display=display,
        _compiled=CompiledOnFirstUse(schema),
    )


def load_catalogue(files: Mapping[str, bytes], name: str, *, where: str) -> ToolCatalogue:
    """Parse ``files[name]`` (YAML) into a :class:`ToolCatalogue`.

    Raises:
        PolicyError: ``policy_load_failed`` naming the file (and line for YAML errors)
            when it is missing, malformed, or a schema is not valid draft 2020-12.
    """
    where = f"{where}/{name}"
    if name not in files:
        raise _fail(where, "missing")
    try:
        data = yaml.safe_load(files[name])
    except yaml.YAMLError as exc:
        raise _fail(where, f"invalid YAML: {exc}") from exc
    if not isinstance(data, dict) or set(data) != {"tools"} or not isinstance(data["tools"], dict):
        raise _fail(where, "must be a mapping with one key 'tools'")
    tools = {}
    for tool_name, raw in data["tools"].items():
        if not isinstance(tool_name, str) or not tool_name:
            raise _fail(where, "tool names must be non-empty strings")
        tools[tool_name] = _parse_tool(tool_name, raw, where)
    return ToolCatalogue(tools=tools)
