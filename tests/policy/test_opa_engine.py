"""Remote OPA engine over OPA's REST Data API.

The endpoint is ``OpaStandin`` (tests/policy/conftest.py): a stand-in speaking OPA's
Data API (``POST /v1/data/<path>`` → ``{"result": ...}`` or ``{}``) on loopback, scripted
to answer each wrong shape, an error status, or too slowly. The same tests run against
a real ``opa run --server`` when an ``opa`` binary is on PATH (skipped otherwise).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cosigner.core.errors import PolicyError
from cosigner.policy.bundle import Bundle
from cosigner.policy.cases import evaluate_case, load_cases
from cosigner.policy.opa_engine import OpaEngine, data_path
from cosigner.policy.store import PolicyStore, engine_factory, run_bundle
from tests.policy.conftest import REFUNDS_PY, OpaStandin, Script, free_port, manifest, write_bundle

ENTRY = "data.cosigner.refunds.decision"
PATH = "cosigner/refunds/decision"
INPUT = {"tool": {"name": "get_order"}, "args": {"order_id": "ord_1"}}
ALLOW = {"effect": "allow", "reasons": [{"code": "read_only", "message": "read tool"}]}


def opa_bundle(
    tmp_path: Path, url: str, *, timeout_ms: int = 500, entrypoint: str = ENTRY
) -> Bundle:
    folder = write_bundle(
        tmp_path,
        "opa",
        {"manifest.toml": manifest(id="refunds-opa", engine="opa", entrypoint=entrypoint)},
    )
    store = PolicyStore(
        [tmp_path], engine_factory=engine_factory(opa_url=url, opa_timeout_ms=timeout_ms)
    )
    return store.load_bundle(folder)


def test_entrypoint_maps_to_a_data_api_path() -> None:
    assert data_path(ENTRY) == PATH
    with pytest.raises(PolicyError):
        data_path("cosigner.refunds")


@pytest.mark.parametrize("url", ["ftp://h:1", "http://h:1/opa", "not a url"])
def test_unsupported_opa_urls_are_refused(url: str) -> None:
    with pytest.raises(PolicyError):
        OpaEngine(url=url, entrypoint=ENTRY)


async def test_a_documented_result_allows_and_the_input_is_sent(
    tmp_path: Path, opa_standin: OpaStandin
) -> None:
    opa_standin.scripts[PATH] = Script(body={"result": ALLOW})
    result = await run_bundle(opa_bundle(tmp_path, opa_standin.url), INPUT)
    assert result.effect == "allow"
    assert opa_standin.requests == [(PATH, {"input": INPUT})]


@pytest.mark.parametrize(
    "body",
    [
        {"result": {"allowed": True}},
        {"result": "true"},
        {"result": 1},
        {"result": None},
        {"result": []},
        {"result": True},
        {"result": {"effect": "allow", "extra": 1}},
    ],
)
async def test_K05_wrong_result_shapes_deny_with_policy_error(
    tmp_path: Path, opa_standin: OpaStandin, body: Any
) -> None:
    opa_standin.scripts[PATH] = Script(body=body)
    result = await run_bundle(opa_bundle(tmp_path, opa_standin.url), INPUT)
    assert (result.effect, result.reasons[0].code) == ("deny", "policy_error")


@pytest.mark.parametrize("body", [{}, {"allowed": True}, {"decision": ALLOW}])
async def test_K05_no_result_member_is_undefined_and_denies(
    tmp_path: Path, opa_standin: OpaStandin, body: Any
) -> None:
    opa_standin.scripts[PATH] = Script(body=body)
    result = await run_bundle(opa_bundle(tmp_path, opa_standin.url), INPUT)
    assert (result.effect, result.reasons[0].code) == ("deny", "undefined")


@pytest.mark.parametrize("raw", [b'"true"', b"1", b"null", b"[]", b"not json", b""])
async def test_K05_bodies_that_are_not_an_object_deny(
    tmp_path: Path, opa_standin: OpaStandin, raw: bytes
) -> None:
    opa_standin.scripts[PATH] = Script(raw=raw)
    result = await run_bundle(opa_bundle(tmp_path, opa_standin.url), INPUT)
    assert (result.effect, result.reasons[0].code) == ("deny", "policy_error")


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_K05_server_errors_are_engine_unavailable(
    tmp_path: Path, opa_standin: OpaStandin, status: int
) -> None:
    opa_standin.scripts[PATH] = Script(status=status, body={"result": ALLOW})
    result = await run_bundle(opa_bundle(tmp_path, opa_standin.url), INPUT)
    assert (result.effect, result.reasons[0].code) == ("deny", "engine_unavailable")


@pytest.mark.parametrize("status", [400, 404])
async def test_client_errors_are_policy_errors(
    tmp_path: Path, opa_standin: OpaStandin, status: int
) -> None:
    opa_standin.scripts[PATH] = Script(status=status, body={"code": "invalid_parameter"})
    result = await run_bundle(opa_bundle(tmp_path, opa_standin.url), INPUT)
    assert (result.effect, result.reasons[0].code) == ("deny", "policy_error")


async def test_K05_slow_opa_denies_within_the_timeout(
    tmp_path: Path, opa_standin: OpaStandin
) -> None:
    opa_standin.scripts[PATH] = Script(body={"result": ALLOW}, delay_s=1.0)
    bundle = opa_bundle(tmp_path, opa_standin.url, timeout_ms=200)
    started = time.monotonic()
    result = await run_bundle(bundle, INPUT)
    elapsed = time.monotonic() - started
    assert (result.effect, result.reasons[0].code) == ("deny", "engine_unavailable")
    assert 0.15 <= elapsed < 0.6


async def test_K05_default_timeout_is_500_ms(tmp_path: Path, opa_standin: OpaStandin) -> None:
    opa_standin.scripts[PATH] = Script(body={"result": ALLOW}, delay_s=1.5)
    engine = OpaEngine(url=opa_standin.url, entrypoint=ENTRY)
    assert engine.timeout_s == 0.5
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        await engine.evaluate(INPUT)
    assert getattr(info.value, "code", None) == "engine_unavailable"
    assert time.monotonic() - started < 1.0
    await engine.close()


async def test_K05_opa_down_denies_quickly(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    result = await run_bundle(opa_bundle(tmp_path, url), INPUT)
    assert (result.effect, result.reasons[0].code) == ("deny", "engine_unavailable")
    assert time.monotonic() - started < 0.6


async def test_golden_cases_through_the_standin_use_the_catalogue_first(
    tmp_path: Path, opa_standin: OpaStandin
) -> None:
    # The stand-in allows everything; catalogue rejections must still deny.
    opa_standin.scripts[PATH] = Script(body={"result": ALLOW})
    folder = write_bundle(
        tmp_path,
        "opa",
        {
            "manifest.toml": manifest(
                id="refunds-opa", engine="opa", entrypoint=ENTRY, extra='catalogue = "tools.yaml"\n'
            ),
            "tools.yaml": (REFUNDS_PY / "tools.yaml").read_text(),
        },
    )
    store = PolicyStore(
        [tmp_path], engine_factory=engine_factory(opa_url=opa_standin.url, opa_timeout_ms=500)
    )
    bundle = store.load_bundle(folder)
    case = load_cases(
        b"- {input: {tool: {name: issue_refund}, args: {amount_minor: -5}}, want: {effect: deny}}",
        where="c",
    )[0]
    result = await evaluate_case(bundle, case.input)
    assert (result.effect, result.reasons[0].code) == ("deny", "invalid_args")
    assert opa_standin.requests == []


# -- the same against a real OPA, when one is installed -------------------------------


async def test_real_opa_answers_the_golden_cases(tmp_path: Path, opa_binary: str) -> None:
    bundle = opa_bundle(tmp_path, opa_binary)
    for case in load_cases((REFUNDS_PY / "cases.yaml").read_bytes(), where="cases.yaml"):
        result = await evaluate_case(bundle, case.input)
        assert result.effect == case.effect, case.description


@pytest.mark.parametrize(
    "rule", ["allowed_true", "string_true", "one", "null_value", "empty_list", "no_such_rule"]
)
async def test_real_opa_wrong_shapes_deny(tmp_path: Path, opa_binary: str, rule: str) -> None:
    bundle = opa_bundle(tmp_path, opa_binary, entrypoint=f"data.shapes.{rule}")
    result = await run_bundle(bundle, INPUT)
    assert result.effect == "deny"
    assert result.reasons[0].code in {"policy_error", "undefined"}
