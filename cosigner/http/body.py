"""Strict request bodies: size limit, strict JSON (cosigner.core.canonical), pydantic model.

FastAPI's own body parsing would accept duplicate keys and NaN, and re-dumping a model
would change what was hashed; so routes read the raw bytes here and keep the parsed
JSON next to the validated model (case K25).
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect
from starlette.types import Receive

from cosigner.core.canonical import parse_json
from cosigner.core.errors import PayloadTooLarge, ValidationFailed

M = TypeVar("M", bound=BaseModel)


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refusing more than ``limit`` bytes (413) without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def receive_body(receive: Receive, declared: bytes | None, limit: int) -> bytes:
    """:func:`read_body` on the raw ASGI ``receive`` (the lean hot routes): ``declared``
    is the ``Content-Length`` header's value, if any. Raises PayloadTooLarge (413)."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body larger than {limit} bytes")
        if not message.get("more_body", False):
            if not chunks:  # the usual case: the whole body in one message
                return bytes(chunk)
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)


def validate(model: type[M], data: Any) -> M:
    """Validate parsed JSON against a wire model; raises ValidationFailed (422)."""
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as exc:
        errors = [{"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
                  for e in exc.errors(include_input=False, include_url=False)]
        raise ValidationFailed("request body does not match the schema",
                               errors=errors) from exc


async def strict_body(request: Request, model: type[M], limit: int) -> tuple[M, Any]:
    """``(validated model, parsed JSON)`` of the request body."""
    raw = await read_body(request, limit)
    data = parse_json(raw)
    return validate(model, data), data


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` documenting a body the route parses itself."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}
