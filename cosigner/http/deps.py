"""Request-scoped dependencies: the app context and the authenticated caller."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Depends, Request, Response

from cosigner.context import AppContext
from cosigner.core import logs, tracing
from cosigner.core.errors import Unauthenticated
from cosigner.http.ratelimit import CALLER_STATE
from cosigner.identity.principals import Caller


def json_response(body: Any, status_code: int = 200) -> Response:
    """A JSON response built with orjson, skipping FastAPI's ``response_model`` pass.

    For hot routes whose body the use case already built in the documented shape (the
    route keeps ``response_model`` for OpenAPI; the schemathesis test holds the shapes).
    """
    return Response(orjson.dumps(body), status_code=status_code,
                    media_type="application/json")


def context(request: Request) -> AppContext:
    """The :class:`AppContext` that ``create_app``'s lifespan built for this app."""
    ctx: AppContext = request.app.state.context
    return ctx


async def authenticate(request: Request) -> Caller:
    """The caller of an API request, from ``Authorization: Bearer <key>`` only, counted
    against its credential's and tenant's rate limits (:mod:`cosigner.identity.quotas`).

    Raises:
        Unauthenticated: no, several or invalid credentials (401).
        RateLimited: a limit of the credential or tenant is used up (429).
    """
    values = request.headers.getlist("authorization")
    return await authenticate_header(
        context(request), (values[0] if values else "") if len(values) < 2 else None,
        getattr(request.state, CALLER_STATE, None),
        decision=request.method == "POST" and request.url.path == "/v1/decisions")


async def authenticate_header(ctx: AppContext, header: str | None,
                              admitted: Caller | None, *, decision: bool) -> Caller:
    """:func:`authenticate` on its parts (the lean hot routes, :mod:`cosigner.http.lean`,
    call it without a Starlette ``Request``): the ``Authorization`` header's value (``""``
    without one, ``None`` when the request carries more than one), the caller the
    rate-limit door already admitted and counted (or ``None``), and whether the request is
    a decision (counted against the tenant's decision quota).

    Raises:
        Unauthenticated: no, several or invalid credentials (401).
        RateLimited: a limit of the credential or tenant is used up (429).
    """
    door = admitted_caller(header, admitted)
    if door is not None:
        return door
    assert header is not None
    _, _, key = header.partition(" ")
    with tracing.span("authenticate") as current:
        caller: Caller = await ctx.authenticator.authenticate(key.strip())
        tracing.set_attributes(current, {"cosigner.tenant": caller.tenant})
    logs.tenant.set(caller.tenant)
    await ctx.quotas.admit(caller, decision=decision)
    return caller


def admitted_caller(header: str | None, admitted: Caller | None) -> Caller | None:
    """:func:`authenticate_header`'s first steps, without awaiting: ``admitted`` (the
    request's tenant set for logging) when the header names a bearer key and the door
    admitted its caller; ``None`` when the key must still be authenticated and counted.

    Raises:
        Unauthenticated: no, several or malformed credentials (401).
    """
    if header is None:
        raise several_credentials()
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthenticated("an API key is required (Authorization: Bearer ...)")
    if admitted is not None:  # authenticated and counted at the door (http.ratelimit)
        logs.tenant.set(admitted.tenant)
    return admitted


def several_credentials() -> Unauthenticated:
    """The refusal of a request carrying more than one ``Authorization`` header (401
    ``unauthenticated``, as a malformed key): which one names the caller would be a
    guess, and the rate-limit door and the routes must never read different ones."""
    return Unauthenticated("more than one Authorization header")


#: Route parameter type for the authenticated caller.
CallerDep = Annotated[Caller, Depends(authenticate)]

#: Problem responses of a route. In the OpenAPI document, an authenticated route's are
#: replaced by the statuses and ``x-codes`` it really answers (cosigner.http.openapi).
PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": {"application/problem+json": {
        "schema": {"$ref": "#/components/schemas/ProblemV1"}}}}
    for status, text in ((400, "Malformed JSON"), (401, "Not authenticated"),
                         (403, "Not allowed"), (409, "Conflict"), (413, "Body too large"),
                         (422, "Invalid request"), (429, "Rate limited (Retry-After)"),
                         (503, "Cannot record or overloaded (Retry-After); treat as deny"))
}
