"""The compiled catalogue validator (jsonschema-rs, issue 20) against ``jsonschema``.

``ToolSpec.validate`` accepts on the compiled validator's word only for float-free
arguments; everything else is decided and worded by ``jsonschema``. These properties hold
that to account: on every schema of the shipped catalogues and on schemas exercising the
keywords that differ most between implementations, the compiled validator accepts a
float-free instance exactly when ``jsonschema`` (with the strict-integer rule and ECMA
``$``) does, and ``validate`` raises exactly the errors (paths, messages, code) that
``jsonschema`` alone reports — including ``100000.0`` where ``type: integer``.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cosigner.core.errors import InvalidArgs
from cosigner.policy import catalogue
from cosigner.policy.catalogue import (
    CompiledOnFirstUse,
    StrictValidator,
    ToolSpec,
    _no_float,
    _pointer,
    compiled_validator,
    load_catalogue,
)

ROOT = Path(__file__).resolve().parents[2]
CATALOGUES = [ROOT / "policies/refunds/tools.yaml", ROOT / "rego/refunds/tools.yaml",
              ROOT / "rego/mcp_filesystem/tools.yaml", ROOT / "cosigner/cli/starter/tools.yaml",
              ROOT / "tests/db/data/bundles/refunds/tools.yaml"]

SYNTHETIC: list[dict[str, Any]] = [
    {"type": "integer"},
    {"type": "integer", "minimum": 1, "maximum": 100000},
    {"type": "number", "multipleOf": 0.5},
    {"type": "integer", "multipleOf": 3},
    {"type": "string", "pattern": "^ord_[0-9]+$"},
    {"type": "string", "pattern": "^[a-z]+$|^x$"},
    {"type": "string", "pattern": "[$]"},
    {"type": "string", "pattern": "\\d{2}"},
    {"type": "string", "pattern": "^[\\w-]+$"},
    {"type": "string", "pattern": "[^\\W]\\D|[\\d]"},
    {"type": "string", "minLength": 2, "maxLength": 3},
    {"type": "array", "uniqueItems": True},
    {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
    {"enum": [1, "1", True, None, {"a": 1}, [1]]},
    {"const": 0},
    {"type": "object", "properties": {"n": {"type": "integer"}},
     "patternProperties": {"^x_": {"type": "string"}}, "additionalProperties": False},
    {"type": "object", "required": ["a"], "minProperties": 1, "maxProperties": 2,
     "propertyNames": {"maxLength": 2}},
    {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]},
    {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]},
    {"not": {"type": "null"}},
    {"type": ["integer", "boolean"]},
    {"if": {"type": "string"}, "then": {"minLength": 1}, "else": {"type": "integer"}},
    {"$defs": {"n": {"type": "integer", "exclusiveMinimum": 0}},
     "type": "array", "prefixItems": [{"$ref": "#/$defs/n"}], "items": False},
    {"type": "object", "dependentRequired": {"a": ["b"]}},
    {"type": "string", "format": "email"},
]


def catalogue_schemas() -> list[dict[str, Any]]:
    schemas = []
    for path in CATALOGUES:
        for tool in yaml.safe_load(path.read_bytes())["tools"].values():
            if tool["schema"] not in schemas:
                schemas.append(tool["schema"])
    return schemas


SCHEMAS = catalogue_schemas() + SYNTHETIC

TEXT = st.one_of(
    st.text(max_size=6),
    st.sampled_from(["", "a", "ab", "abc", "x", "x_1", "ord_1", "ord_8472", "ord_1\n",
                     "ord_", "ORD_1", "ord_a1", "12", "١٢", "0٠", "é-", "a$",
                     "\U0001f600\U0001f600",
                     "é", "USD", "EUR", "XYZ", "duplicate_charge", "goodwill", "name",
                     "size", "/tmp/a", "a@b.c", "path", "query"]),
    st.from_regex(r"\Aord_[A-Za-z0-9]{0,34}\Z"),
)
NUMBER = st.one_of(
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.sampled_from([0, 1, 3, 5000, 100000, 100001, -1, 0.0, 1.0, 0.5, 1.5, 100000.0,
                     -0.0, 1e-7, 3.0, 2.5, 1e20]),
    st.floats(allow_nan=False, allow_infinity=False),
)
SCALAR = st.one_of(st.none(), st.booleans(), NUMBER, TEXT)
JSON = st.recursive(
    SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(TEXT, st.sampled_from(
            ["a", "b", "n", "x_a", "order_id", "amount_minor", "currency", "reason_code",
             "path", "head", "tail", "paths", "query", "sortBy", "to", "subject", "body"])),
            inner, max_size=5)),
    max_leaves=12)


@st.composite
def instances(draw: st.DrawFn, schema: dict[str, Any]) -> Any:
    """Mostly near-valid objects for object schemas (each property drawn from values that
    often satisfy it), else any JSON."""
    props = schema.get("properties")
    if props and draw(st.integers(0, 3)):
        value = {}
        for name, sub in props.items():
            if draw(st.integers(0, 5)) == 0:
                continue
            choices = sub.get("enum")
            if choices and draw(st.booleans()):
                value[name] = draw(st.sampled_from(choices))
            elif sub.get("type") == "array":
                value[name] = draw(st.lists(TEXT, max_size=3))
            else:
                value[name] = draw(SCALAR)
        if draw(st.integers(0, 4)) == 0:
            value[draw(TEXT)] = draw(JSON)
        return value
    return draw(JSON)


def python_errors(schema: dict[str, Any], instance: Any) -> list[dict[str, str]]:
    errors = [{"path": _pointer(e.absolute_path), "message": e.message}
              for e in StrictValidator(schema).iter_errors(instance)]
    return sorted(errors, key=lambda e: (e["path"], e["message"]))


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_compiled_accepts_exactly_what_jsonschema_accepts(index: int, data: Any) -> None:
    schema = SCHEMAS[index]
    compiled = compiled_validator(schema)
    assert compiled is not None
    spec = ToolSpec(name="t", side_effect="read", mask=(), schema=schema,
                    _validator=StrictValidator(schema), _compiled=compiled)
    instance = data.draw(instances(schema))
    expected = python_errors(schema, instance)
    if _no_float(instance):  # where the compiled validator's word is taken
        assert compiled.is_valid(instance) == (not expected), (schema, instance)
    if expected:
        with pytest.raises(InvalidArgs) as info:
            spec.validate(instance)
        assert info.value.code == "invalid_args"
        assert info.value.extra["errors"] == expected
    else:
        spec.validate(instance)


def test_strict_integer_is_decided_by_jsonschema() -> None:
    schema = {"type": "object", "properties": {"amount_minor": {"type": "integer"}}}
    compiled = compiled_validator(schema)
    assert compiled is not None and compiled.is_valid({"amount_minor": 100000.0})
    spec = ToolSpec(name="t", side_effect="read", mask=(), schema=schema,
                    _validator=StrictValidator(schema), _compiled=compiled)
    with pytest.raises(InvalidArgs) as info:
        spec.validate({"amount_minor": 100000.0})
    assert info.value.extra["errors"] == [
        {"path": "/amount_minor", "message": "100000.0 is not of type 'integer'"}]
    spec.validate({"amount_minor": 100000})
    with pytest.raises(InvalidArgs):
        spec.validate({"amount_minor": True})


def test_ecma_dollar_is_end_of_input_in_both() -> None:
    schema = {"type": "string", "pattern": "^ord_[0-9]+$"}
    compiled = compiled_validator(schema)
    assert compiled is not None
    assert not compiled.is_valid("ord_1\n")
    assert python_errors(schema, "ord_1\n")


def test_no_compiled_validator_for_remote_references() -> None:
    schema = {"$ref": "https://example.invalid/schema.json"}
    assert compiled_validator(schema) is None


REFUND_ARGS = {"order_id": "ord_8472", "amount_minor": 5000, "currency": "USD",
               "reason_code": "duplicate_charge"}


def test_a_loaded_tool_builds_its_compiled_validator_on_first_use_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 20 (idle memory): loading a bundle, golden cases included, builds no compiled
    # validator; the first validations, arriving together on eight threads, build it once.
    built: list[Any] = []

    def counting(schema: Any) -> Any:
        built.append(schema)
        return compiled_validator(schema)

    monkeypatch.setattr(catalogue, "compiled_validator", counting)
    raw = (ROOT / "policies/refunds/tools.yaml").read_bytes()
    spec = load_catalogue({"tools.yaml": raw}, "tools.yaml", where="t").lookup("issue_refund")
    assert spec is not None
    spec.validate(REFUND_ARGS, compiled=False)
    assert built == []
    start = threading.Barrier(8)

    def first_use(_: int) -> None:
        start.wait()
        spec.validate(REFUND_ARGS)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(first_use, range(8)))
    assert len(built) == 1
    lazy = spec._compiled
    assert isinstance(lazy, CompiledOnFirstUse)
    assert lazy.is_valid.__self__ is not lazy  # now the compiled validator's own method
    assert lazy.is_valid(REFUND_ARGS) and not lazy.is_valid({**REFUND_ARGS, "amount_minor": "5"})
    with pytest.raises(InvalidArgs) as info:
        spec.validate({**REFUND_ARGS, "amount_minor": "5"})
    assert info.value.extra["errors"] == python_errors(spec.schema,
                                                       {**REFUND_ARGS, "amount_minor": "5"})
    assert len(built) == 1


def test_without_a_compiled_validator_jsonschema_decides_everything() -> None:
    lazy = CompiledOnFirstUse({"$ref": "https://example.invalid/schema.json"})
    assert lazy.is_valid({}) is False
    assert lazy.is_valid(1) is False


ECMA_PATTERNS = [r"\d{2}", r"[\d]", r"\D", r"[\D]", r"\w+$", r"[\w-]", r"[^\W]", r"[\W]",
                 r"\W", r"^[\d\w]$", r"\\d", r"[a\]\d]"]


@settings(max_examples=2000, deadline=None)
@given(pattern=st.sampled_from(ECMA_PATTERNS), text=st.text(alphabet=st.sampled_from(
    list("0a_Z-]\\d \u0660\u00e9\u00a0\U0001f600\n!/:@[^`{")), max_size=4))
def test_ecma_classes_are_ascii_as_in_the_compiled_validator(pattern: str, text: str) -> None:
    """``\\d \\D \\w \\W`` (in and out of ``[...]``) match what jsonschema-rs matches
    (ECMA-262: ASCII digits and word characters), not Python's Unicode classes."""
    compiled = compiled_validator({"type": "string", "pattern": pattern})
    assert compiled is not None
    assert StrictValidator({"type": "string", "pattern": pattern}).is_valid(text) == \
        compiled.is_valid(text), (pattern, text)


def _no_float_reference(value: Any) -> bool:
    """_no_float as it was before session 8 (all() over a generator per container)."""
    t = type(value)
    if t is dict:
        return all(_no_float_reference(v) for v in value.values())
    if t is list:
        return all(_no_float_reference(v) for v in value)
    return t is not float


@settings(max_examples=1000, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=4), max_leaves=20))
def test_no_float_answers_as_before(value: Any) -> None:
    assert _no_float(value) is _no_float_reference(value)
