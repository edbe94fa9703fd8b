"""openapi.yaml generates good clients: every ``$ref`` resolves, operation ids are the route
names, bearer auth is declared where it is required, each problem response lists its stable
codes (held to the source), the README's bodies are the examples, and the standard
generators (openapi-python-client from PyPI, openapi-typescript from npm) take the file
without a warning; the generated Python client gets a decision from a live server."""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cosigner.app import create_app
from cosigner.core import errors
from cosigner.core.clock import system_clock
from cosigner.db.database import Database
from cosigner.http import examples
from cosigner.http.codes import CODES, ROUTE_CODES
from cosigner.http.openapi import DOCUMENTED_MODELS
from cosigner.identity.principals import create_api_key
from tests.conftest import ROOT, LiveServer

TS_DIR = Path(__file__).resolve().parent / "openapi_ts"
PUBLIC = {"/healthz", "/readyz", "/.well-known/jwks.json"}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    return loaded


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def by_name(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Operations by route function name (``postDecision`` → ``post_decision``)."""
    return {re.sub(r"([A-Z])", lambda m: "_" + m[1].lower(), op["operationId"]): op
            for _, _, op in operations(document)}


def resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and part in node, f"{ref} does not resolve"
        node = node[part]
    return node


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from [value] if key == "$ref" else refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def test_every_ref_in_openapi_yaml_resolves(document: dict[str, Any]) -> None:
    found = set(refs(document))
    assert "#/components/schemas/ActivateV1" in found and len(found) > 30
    for ref in found:
        resolve(document, ref)


def test_operation_ids_are_the_route_names_in_camel_case(document: dict[str, Any]) -> None:
    ids = [op["operationId"] for _, _, op in operations(document)]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z]+([A-Z][a-z]+)*", i) for i in ids), ids
    assert {"postDecision", "postRedeem", "activateVersion", "setShadow",
            "getShadowReport", "healthz"} <= set(ids)


def test_bearer_auth_is_declared_on_every_authenticated_route(
        document: dict[str, Any]) -> None:
    scheme = document["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, _, op in operations(document):
        if path in PUBLIC:
            assert "security" not in op, path
        else:
            assert op["security"] == [{"bearerAuth": []}], path
            assert "unauthenticated" in op["responses"]["401"]["x-codes"], path


async def test_public_routes_answer_without_a_key_and_the_others_ask_for_one(
        harness: Any, document: dict[str, Any]) -> None:
    """The ``security`` declarations hold on the server: 401 exactly where declared."""
    for path, method, op in operations(document):
        url = re.sub(r"\{[^}]+\}", "x", path)
        resp = await harness.client.request(method.upper(), url,
                                            params={"wait": "0"} if "wait" in url else None)
        assert (resp.status_code == 401) == ("security" in op), (method, path, resp.text)


def test_every_problem_response_lists_codes_of_its_status(document: dict[str, Any]) -> None:
    from cosigner.http.codes import status_of

    for path, _, op in operations(document):
        for status, response in op["responses"].items():
            if "application/problem+json" not in response.get("content", {}):
                continue
            codes = response["x-codes"]
            assert codes and codes == sorted(codes), (path, status)
            for code in codes:
                assert code in CODES, code
                if not (path == "/v1/permits/redeem" and code == "invalid_args"):
                    assert status_of(code) == int(status), (path, code)
    redeem = document["paths"]["/v1/permits/redeem"]["post"]["responses"]
    assert "invalid_args" in redeem["403"]["x-codes"]  # raised as a permit refusal there


def _source_codes() -> set[str]:
    """Codes the API's source raises: ``code="x"`` arguments and class defaults, outside
    the command line and the web form's own sign-in (single sign-on included) and passkey
    registration pages."""
    found: set[str] = set()
    for path in (ROOT / "cosigner").rglob("*.py"):
        rel = path.relative_to(ROOT / "cosigner").as_posix()
        if rel.startswith(("cli/", "web/")) or rel in {
                "identity/accounts.py", "identity/passkeys.py", "identity/oidc.py",
                "identity/oidc_signin.py", "http/codes.py"}:
            continue
        found.update(re.findall(r'code="([a-z_]+)"', path.read_text()))
    return found


def test_the_code_table_is_whole_and_raised() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "cosigner").rglob("*.py")
                       if p.name != "codes.py")
    for code in CODES:
        assert f'"{code}"' in source, f"{code} is listed but never raised"
    unlisted = _source_codes() - set(CODES) - {
        "policy_load_failed",   # load/test reports and the CLI, never an API answer
        "engine_unavailable",   # remote OPA down: a deny, never a problem (K05)
        "invalid_subject", "invalid_roles", "invalid_tenant",  # principal creation (CLI)
        "invalid_limit",        # the CLI's audit reads; the API bounds limit by schema
        "principal_disabled",   # a Slack click's refusal: answered in Slack, logged
        "slack_signin_stale",   # a Slack click's refusal: answered in Slack, logged
    }
    assert not unlisted, f"raised but not in cosigner.http.codes.CODES: {sorted(unlisted)}"
    for entries in ROUTE_CODES.values():
        for entry in entries:
            assert (entry[0] if isinstance(entry, tuple) else entry) in CODES


def test_codes_a_route_docstring_names_are_in_its_x_codes(document: dict[str, Any]) -> None:
    ops = by_name(document)
    for name, op in ops.items():
        named = set(re.findall(r"``([a-z_]+)``", op.get("description", ""))) & set(CODES)
        listed = {c for r in op["responses"].values() for c in r.get("x-codes", ())}
        assert named <= listed, (name, named - listed)


def _readme_bodies() -> list[tuple[str, Any]]:
    """``(path, body)`` of the README's curl calls whose ``-d`` body is literal JSON."""
    found = []
    text = (ROOT / "README.md").read_text()
    for call in re.findall(r"curl -s[^\n]*(?:\n\s+[^\n]*)*", text):
        path = re.search(r"http://127\.0\.0\.1:8080(/[^\s\"?]*)", call)
        body = re.search(r"-d '(\{.*?\})'", call, re.S)
        if path is None or body is None:
            continue
        try:
            parsed = json.loads(body[1], object_pairs_hook=_no_duplicates)
        except ValueError:
            continue  # shell-interpolated, or the duplicate-key example
        found.append((path[1], parsed))
    return found


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len({k for k, _ in pairs}) != len(pairs):
        raise ValueError("duplicate key")
    return dict(pairs)


def test_the_readme_bodies_are_the_examples(document: dict[str, Any]) -> None:
    bodies = _readme_bodies()
    assert len(bodies) >= 5
    for path, body in bodies:
        template = next(p for p in document["paths"]
                        if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", p), path))
        media = document["paths"][template]["post"]["requestBody"]["content"]
        values = [e["value"] for e in media["application/json"]["examples"].values()]
        assert body in values, (path, body)


def test_every_example_validates_against_its_model(document: dict[str, Any]) -> None:
    from cosigner.http.models.decisions import DecisionV1, ProblemV1

    models = {m.__name__: m for m in DOCUMENTED_MODELS}
    ops = by_name(document)
    for name, named in examples.REQUESTS.items():
        ref = ops[name]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        for value in named.values():
            models[ref.rsplit("/", 1)[1]].model_validate(value, strict=True)
    for _, named in examples.RESPONSES.values():
        for value in named.values():
            DecisionV1.model_validate(value)
    for _, named in examples.PROBLEMS.values():
        for value in named.values():
            ProblemV1.model_validate(value)
    assert "duplicate_key" in ops["post_decision"]["responses"]["422"]["x-codes"]


def test_a_missing_schema_refuses_to_build_the_document(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault of issue 21 (ActivateV1/ShadowV1 referenced, never defined) cannot return."""
    from cosigner.http import openapi

    monkeypatch.setattr(openapi, "DOCUMENTED_MODELS", tuple(
        m for m in openapi.DOCUMENTED_MODELS if m.__name__ != "ShadowV1"))
    with pytest.raises(RuntimeError, match="ShadowV1"):
        create_app().openapi()


def test_openapi_typescript_takes_the_file_without_warnings(tmp_path: Path) -> None:
    cli = TS_DIR / "node_modules" / "openapi-typescript" / "bin" / "cli.js"
    if not cli.is_file():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is missing: run scripts/ensure-test-deps.sh (installs Node.js)")
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                       cwd=TS_DIR, check=True, timeout=600)
    node = shutil.which("node")
    assert node is not None
    done = subprocess.run([node, str(cli), str(ROOT / "openapi.yaml"), "-o",
                           str(tmp_path / "cosigner.d.ts")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not re.search(r"warn|error", done.stdout + done.stderr, re.I), done.stderr
    types = (tmp_path / "cosigner.d.ts").read_text()
    for name in ("postDecision", "activateVersion", "setShadow", "ActivateV1", "ShadowV1"):
        assert name in types


@pytest.fixture
def generated_client(tmp_path: Path) -> Iterator[Any]:
    """The Python package openapi-python-client makes from openapi.yaml, importable."""
    (tmp_path / "config.yaml").write_text("post_hooks: []\npackage_name_override: cosigner_api\n")
    exe = Path(sys.executable).with_name("openapi-python-client")
    done = subprocess.run(
        [str(exe), "generate", "--path", str(ROOT / "openapi.yaml"), "--meta", "none",
         "--output-path", str(tmp_path / "cosigner_api"), "--config",
         str(tmp_path / "config.yaml")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr
    for route in ("decisions/post_decision", "policies/activate_version",
                  "policies/set_shadow", "approvals/post_withdraw_rejection"):
        assert (tmp_path / "cosigner_api" / "api" / f"{route}.py").is_file(), route
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("cosigner_api")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.split(".")[0] == "cosigner_api"]:
            del sys.modules[name]


def test_the_generated_python_client_gets_a_decision(
        generated_client: Any, live_server_factory: Callable[..., LiveServer],
        database_url: str) -> None:
    server = live_server_factory()
    tenant = f"gen-{uuid.uuid4().hex[:8]}"

    async def make_key() -> str:
        db = Database(database_url)
        try:
            key, _ = await create_api_key(db, tenant=tenant, roles=["runtime"],
                                          subject="generated-client", clock=system_clock)
            return key
        finally:
            await db.dispose()

    key = asyncio.run(make_key())
    api = importlib.import_module("cosigner_api.api.decisions.post_decision")
    models = importlib.import_module("cosigner_api.models")
    body = models.DecisionRequestV1.from_dict(examples.REQUESTS["post_decision"]["refund"])
    client = generated_client.AuthenticatedClient(base_url=server.url, token=key)
    with client:
        response = api.sync_detailed(client=client, body=body)
        assert response.status_code == 200, response.content
        assert response.parsed.effect == "allow"
        assert response.parsed.permit.token.count(".") == 2
        anonymous = generated_client.Client(base_url=server.url)
        with anonymous:
            refused = api.sync_detailed(client=anonymous, body=body)
        assert refused.status_code == 401
        assert refused.parsed.code == "unauthenticated"


def test_domain_codes_have_a_status_other_than_500() -> None:
    from cosigner.http.codes import status_of

    for code, cls in CODES.items():
        assert issubclass(cls, errors.CosignerError)
        # a 500 only for damaged stored data, answered with its own code (IntegrityFault)
        assert status_of(code) < 500 or code in ("storage_unavailable",
                                                 "audit_event_unreadable"), code
