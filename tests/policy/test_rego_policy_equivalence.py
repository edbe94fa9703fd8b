"""The shipped Rego policies (rego/refunds, rego/mcp_filesystem) decide as before.

Session 7 rewrote ``rego/refunds/refunds.rego`` for rego-cpp's evaluator (objects built
only in the branch that is taken, lists instead of set literals, no wrapper object) and
the engine's input conversion (cosigner/policy/rego_input.py). The earlier text is kept
in ``tests/policy/data/refunds_v1.rego`` and evaluated the earlier way (regopy's
``set_input`` and ``query_bundle_entrypoint``); on random inputs — tools and arguments
missing, of every JSON type, amounts at and around each limit, as floats, strings and
booleans — the engine's answer today is the same value or the same kind of failure.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import regopy
from hypothesis import given
from hypothesis import strategies as st

from cosigner.core.errors import PolicyError
from cosigner.policy.rego_engine import RegoEngine, compile_modules
from tests.policy.conftest import REFUNDS_REGO

ENTRY = "data.cosigner.refunds.decision"
PLAN = "cosigner/refunds/decision"
V1 = Path(__file__).parent / "data" / "refunds_v1.rego"


def today_and_earlier(folder: Path, entry: str, plan: str, earlier_text: Path,
                      sources: dict[str, str]
                      ) -> tuple[RegoEngine, regopy.Interpreter, regopy.Bundle]:
    """The shipped bundle in ``folder`` as the engine loads it, and the earlier policy
    text (``sources``, read from ``earlier_text``) compiled as before session 7."""
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    today = RegoEngine.from_files(files, entrypoint=entry, where=str(folder))
    it, bundle = compile_modules(sources, [plan], where=str(earlier_text))
    return today, it, bundle


@pytest.fixture(scope="module")
def engines() -> tuple[RegoEngine, regopy.Interpreter, regopy.Bundle]:
    return today_and_earlier(REFUNDS_REGO, ENTRY, PLAN, V1,
                             {"refunds.rego": V1.read_text()})


def earlier(it: regopy.Interpreter, bundle: regopy.Bundle, doc: dict[str, Any],
            plan: str = PLAN) -> Any:
    """The engine's evaluation before session 7 (only the members the policy reads)."""
    it.set_input({k: doc[k] for k in ("tool", "args") if k in doc})
    output = it.query_bundle_entrypoint(bundle, plan)
    if not output.ok():
        raise PolicyError("error")
    results = output.results
    if not results or not results[0].expressions:
        return None
    return results[0].expressions[0]


def holds_nul(value: Any) -> bool:
    """A string holding U+0000 anywhere in ``value`` (keys included)."""
    if isinstance(value, str):
        return "\0" in value
    if isinstance(value, dict):
        return any(holds_nul(k) or holds_nul(v) for k, v in value.items())
    return isinstance(value, list) and any(map(holds_nul, value))


def as_before(it: regopy.Interpreter, bundle: regopy.Bundle, doc: dict[str, Any],
              plan: str = PLAN) -> tuple[str, Any]:
    """The earlier evaluation's outcome, except that a string with U+0000 in what the
    policy reads is now refused (rego-cpp saw it cut short at the NUL): a PolicyError."""
    if holds_nul([doc.get("tool"), doc.get("args")]):
        return ("error", "PolicyError")
    return outcome(lambda: earlier(it, bundle, doc, plan))


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return ("ok", call())
    except Exception as exc:
        return ("error", type(exc).__name__)


json_scalar = (st.none() | st.booleans() | st.integers(-(2**53), 2**53)
               | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6))


def json_containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)


json_value = st.recursive(json_scalar, json_containers, max_leaves=6)
LIMITS = [0, 1, 2, 99_999, 100_000, 100_001, 199_999, 200_000, 200_001]
amount = (st.sampled_from(LIMITS) | st.integers(-5, 300_000)
          | st.sampled_from(LIMITS).map(float) | st.floats(-1, 300_000, allow_nan=False)
          | st.sampled_from([0.5, 100000.5, 1e300, -0.0, True, False, "100", None, [], {}])
          | json_value)
currency = st.sampled_from(["USD", "EUR", "GBP", "usd", "JPY", "", None, 1, ["USD"]]) | json_value
tool_name = st.sampled_from(["get_order", "get_payment_events", "get_refund_status",
                             "search_policy", "issue_refund", "delete_customer", "",
                             "Issue_refund", None, 7, ["get_order"], {"name": "get_order"}])
args = st.fixed_dictionaries(
    {}, optional={"amount_minor": amount, "currency": currency, "order_id": st.text(max_size=4),
                  "reason_code": json_value})
tool = st.fixed_dictionaries({}, optional={"name": tool_name, "side_effect": json_value})
docs = st.fixed_dictionaries(
    {}, optional={"tool": tool | json_value, "args": args | json_value,
                  "context": json_value, "tenant": st.text(max_size=4)})
refund_calls = st.fixed_dictionaries({
    "tool": st.just({"name": "issue_refund"}),
    "args": st.fixed_dictionaries({"amount_minor": amount,
                                   "currency": st.sampled_from(["USD", "EUR", "GBP", "JPY"])}),
})


@given(doc=docs | refund_calls)
def test_refund_policy_decides_as_before(
        engines: tuple[RegoEngine, regopy.Interpreter, regopy.Bundle], doc: dict[str, Any]
) -> None:
    today, it, bundle = engines
    assert outcome(lambda: today.evaluate_sync(doc)) == as_before(it, bundle, doc)


@pytest.mark.parametrize("currency", ["USD", "EUR", "GBP", "JPY", None])
def test_every_limit_decides_as_before(
        engines: tuple[RegoEngine, regopy.Interpreter, regopy.Bundle], currency: Any) -> None:
    today, it, bundle = engines
    for value in [*LIMITS, *map(float, LIMITS), 5000, 150000, 250000, 5.5, "5000", None, True]:
        doc = {"tool": {"name": "issue_refund", "side_effect": "financial"},
               "args": {"order_id": "ord_8472", "amount_minor": value, "currency": currency,
                        "reason_code": "duplicate_charge"}}
        assert today.evaluate_sync(doc) == earlier(it, bundle, doc) is not None, value


# The filesystem bundle (rego/mcp_filesystem), rewritten the same way: a path without ".."
# is inside without counting segments, the count is one comprehension per segment instead
# of two, lists for the tool names, objects bound after each branch's test.
MCP = REFUNDS_REGO.parent / "mcp_filesystem"
MCP_ENTRY = "data.cosigner.mcp_filesystem.decision"
MCP_PLAN = "cosigner/mcp_filesystem/decision"
MCP_V1 = Path(__file__).parent / "data" / "mcp_filesystem_v1.rego"


@pytest.fixture(scope="module")
def mcp_engines() -> tuple[RegoEngine, regopy.Interpreter, regopy.Bundle]:
    return today_and_earlier(MCP, MCP_ENTRY, MCP_PLAN, MCP_V1, {
        "mcp_filesystem.rego": MCP_V1.read_text(),
        "roots.rego": (MCP / "roots.rego").read_text()})


segment = st.sampled_from(["", ".", "..", "a", "b", "mcp", "srv", "...", "..a", "etc"])
paths = (st.tuples(st.sampled_from(["/srv/mcp", "/srv/mcp/", "/srv", "/srv/mcp-evil", "",
                                    "srv/mcp", "/srv/mcp\u0000"]),
                   st.lists(segment, max_size=8))
         .map(lambda t: t[0] + "/".join(["", *t[1]]) if t[1] else t[0])
         | json_value)
fs_tools = st.sampled_from(["read_text_file", "read_multiple_files", "list_allowed_directories",
                            "move_file", "write_file", "edit_file", "delete_file",
                            "get_file_info"]).map(lambda t: "filesystem." + t)
fs_args = st.fixed_dictionaries({}, optional={
    "path": paths, "paths": st.lists(paths, max_size=4) | paths, "source": paths,
    "destination": paths, "content": st.text(max_size=3)})
fs_docs = st.fixed_dictionaries({}, optional={
    "tool": st.fixed_dictionaries({}, optional={"name": fs_tools | tool_name | json_value})
    | json_value,
    "args": fs_args | json_value})


@given(doc=fs_docs)
def test_filesystem_policy_decides_as_before(
        mcp_engines: tuple[RegoEngine, regopy.Interpreter, regopy.Bundle], doc: dict[str, Any]
) -> None:
    today, it, bundle = mcp_engines
    assert outcome(lambda: today.evaluate_sync(doc)) == as_before(it, bundle, doc, MCP_PLAN)


def test_a_nul_in_a_path_is_refused_not_read_cut_short(
        mcp_engines: tuple[RegoEngine, regopy.Interpreter, regopy.Bundle]) -> None:
    """rego-cpp would read ``/srv/mcp/a\\0/../../etc/passwd`` as ``/srv/mcp/a`` (inside
    the root: the earlier engine allowed it) while the tool gets the whole path."""
    today, it, bundle = mcp_engines
    for path in ["/srv/mcp/a\0/../../../etc/passwd", "/srv/mcp\0/../etc", "\0"]:
        doc = {"tool": {"name": "filesystem.read_text_file"}, "args": {"path": path}}
        with pytest.raises(PolicyError):
            today.evaluate_sync(doc)
    doc = {"tool": {"name": "filesystem.read_text_file"},
           "args": {"path": "/srv/mcp/a\0/../../../etc/passwd"}}
    assert earlier(it, bundle, doc, MCP_PLAN)["effect"] == "allow"  # what regopy did


def test_every_short_path_under_the_root_decides_as_before(
        mcp_engines: tuple[RegoEngine, regopy.Interpreter, regopy.Bundle]) -> None:
    today, it, bundle = mcp_engines
    alphabet = ["a", "..", ".", ""]
    checked = 0
    for length in range(5):
        for combo in itertools.product(alphabet, repeat=length):
            path = "/".join(["/srv/mcp", *combo])
            doc = {"tool": {"name": "filesystem.read_text_file"}, "args": {"path": path}}
            assert today.evaluate_sync(doc) == earlier(it, bundle, doc, MCP_PLAN), path
            checked += 1
    assert checked == 341
