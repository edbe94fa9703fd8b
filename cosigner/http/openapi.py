"""The OpenAPI document, shaped for generated clients.

FastAPI's own output is completed here, in one pass over the app's routes:

- operation ids are the route function's name in camelCase (``post_decision`` →
  ``postDecision``), stable across path changes;
- the bodies routes parse themselves (:func:`cosigner.http.body.openapi_body`) and the
  problem document get their schemas; :func:`install` refuses to answer a document with a
  ``$ref`` that does not resolve;
- a ``bearerAuth`` security scheme, applied to every route that depends on
  :func:`cosigner.http.deps.authenticate` (health and JWKS stay public);
- every problem response lists the stable codes the route answers with that status as
  ``x-codes`` (from :mod:`cosigner.http.codes`);
- request and response examples from the README (:mod:`cosigner.http.examples`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, routing
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from pydantic import BaseModel

from cosigner.http import examples
from cosigner.http.codes import codes_for
from cosigner.http.deps import authenticate
from cosigner.http.models.approvals import (
    AfterReviewRequestV1,
    BarrierAskV1,
    BreakGlassRequestV1,
    RedeemRequestV1,
    ReviewAskV1,
    ReviewRequestV1,
    WithdrawRejectionV1,
)
from cosigner.http.models.decisions import DecisionRequestV1, ProblemV1
from cosigner.http.models.policies import ActivateV1, ReplayV1, ShadowV1
from cosigner.http.models.runs import OutcomeReportV1, RunContractV1

#: Models of bodies that routes parse themselves, and of the problem document.
DOCUMENTED_MODELS: tuple[type[BaseModel], ...] = (
    DecisionRequestV1, ProblemV1, RunContractV1, OutcomeReportV1, ReviewAskV1,
    BarrierAskV1, ReviewRequestV1, WithdrawRejectionV1, RedeemRequestV1, ActivateV1, ShadowV1,
    ReplayV1, BreakGlassRequestV1, AfterReviewRequestV1)

BEARER = "bearerAuth"
_PROBLEM_REF = {"$ref": "#/components/schemas/ProblemV1"}
_STATUS_TEXT = {400: "Malformed JSON", 401: "Not authenticated", 403: "Not allowed",
                404: "Not found", 409: "Conflict with the current state",
                413: "Body too large", 422: "Invalid request",
                500: "A stored record the answer depends on does not read back "
                     "(damaged data); do not act on it",
                503: "Cannot record or look up; treat as deny"}


def operation_id(route: APIRoute) -> str:
    """``post_decision`` → ``postDecision`` (FastAPI's ``generate_unique_id_function``)."""
    head, *rest = route.name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def install(app: FastAPI) -> None:
    """Replace ``app.openapi`` with the completed, cached document."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if not app.openapi_schema:
            app.openapi_schema = complete(app, original())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def complete(app: FastAPI, schema: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's ``schema`` with models, security, codes and examples added."""
    components = schema.setdefault("components", {})
    models = components.setdefault("schemas", {})
    for model in DOCUMENTED_MODELS:
        model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in model_schema.pop("$defs", {}).items():
            models.setdefault(name, sub)
        models[model.__name__] = model_schema
    models["ProblemV1"]["properties"]["code"]["description"] = (
        "Stable machine code; each response lists the codes it can carry in x-codes.")
    components["securitySchemes"] = {BEARER: {
        "type": "http", "scheme": "bearer", "bearerFormat": "Cosigner API key",
        "description": "An API key from `cosigner principals add-key` (roles and "
                       "tenant come from the key)."}}
    for route in routing.iter_route_contexts(app.routes):
        if isinstance(route.original_route, APIRoute) and route.include_in_schema:
            for method in route.methods or ():
                _complete_operation(route, schema["paths"][route.path_format][method.lower()])
    missing = sorted(set(_refs(schema)) - {f"#/components/schemas/{n}" for n in models})
    if missing:
        raise RuntimeError(f"OpenAPI references undefined schemas: {missing}")
    return schema


def _complete_operation(route: routing.RouteContext, operation: dict[str, Any]) -> None:
    authenticated = _depends_on(route.dependant, authenticate)
    if authenticated:
        operation["security"] = [{BEARER: []}]
    responses = operation.setdefault("responses", {})
    for status in [s for s, r in responses.items() if _is_problem(r)]:
        del responses[status]
    if authenticated:
        has_body = "requestBody" in operation
        has_parameters = bool(route.dependant.path_params or route.dependant.query_params)
        for status, codes in codes_for(str(route.name), authenticated=True, body=has_body,
                                       parameters=has_parameters).items():
            responses[str(status)] = {
                "description": _STATUS_TEXT[status],
                "content": {"application/problem+json": {"schema": dict(_PROBLEM_REF)}},
                "x-codes": codes}
        operation["responses"] = dict(sorted(responses.items()))
    if route.name in examples.REQUESTS:
        media = operation["requestBody"]["content"]["application/json"]
        media["examples"] = {name: {"value": copy.deepcopy(value)}
                             for name, value in examples.REQUESTS[route.name].items()}
    for table, media_type in ((examples.RESPONSES, "application/json"),
                              (examples.PROBLEMS, "application/problem+json")):
        if route.name in table:
            status, named = table[route.name]
            media = responses[str(status)]["content"][media_type]
            media["examples"] = {name: {"value": copy.deepcopy(value)}
                                 for name, value in named.items()}


def _is_problem(response: dict[str, Any]) -> bool:
    return "application/problem+json" in response.get("content", {}) or (
        response.get("content", {}).get("application/json", {}).get("schema") == _PROBLEM_REF)


def _depends_on(dependant: Dependant, call: Any) -> bool:
    return any(dep.call is call or _depends_on(dep, call) for dep in dependant.dependencies)


def _refs(node: Any) -> Iterator[str]:
    """Every ``$ref`` value in a JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)
