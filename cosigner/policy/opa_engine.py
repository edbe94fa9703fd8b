"""Remote OPA engine: ask an OPA server over its REST Data API.

``POST {opa_url}/v1/data/<entrypoint path>`` with ``{"input": <input document>}``; OPA
answers ``{"result": <value>}``, or ``{}`` when the rule is undefined
(https://www.openpolicyagent.org/docs/rest-api#get-a-document-with-input).

Client: ``opa-python-client``'s ``AsyncOpaClient.query_rule`` (aiohttp). It honours a
total timeout per request (``aiohttp.ClientTimeout``); we build it with ``retries=0`` so
its retry/backoff loop never stretches a decision past the timeout, and wrap the call in
``asyncio.timeout`` as the hard deadline. Its limits, accepted here: it addresses OPA by
scheme/host/port (no path prefix in ``opa_url``), and its aiohttp session belongs to one
event loop, so the engine opens one lazily per loop and :meth:`OpaEngine.close` closes it.

Faults (translated here and nowhere else, STYLE habit 5):

- unreachable, timed out, HTTP 5xx → :class:`Unavailable` ``engine_unavailable``;
- HTTP 4xx, a body that is not a JSON object, ``{"result": null}`` → :class:`PolicyError`
  ``policy_error`` (OPA never answers null for an undefined rule);
- ``{}`` or a body without ``result`` → ``None`` (undefined).

Any other ``result`` is returned raw and the store validates it: only the documented
result object allows; ``{"allowed": true}``, ``"true"``, ``1``, ``[]`` all deny (K05).

What OPA evaluated: every query asks ``?provenance=true``, and OPA answers with
``"provenance": {"version", "build_commit", ..., "bundles": {<name>: {"revision": ...}}}``
(https://www.openpolicyagent.org/docs/rest-api#provenance; ``bundles`` lists the bundles
OPA has activated and the ``revision`` of each bundle's ``.manifest``). The revisions go
back with the result (:meth:`OpaEngine.evaluate_traced`) and into the decision's recorded
revision (:func:`cosigner.policy.store.run_bundle_traced`), so a policy changed inside OPA
shows in every record. The manifest's ``[opa] bundle`` names the one bundle that matters
(otherwise every reported bundle counts); with ``require_revision = true`` an answer that
does not carry it (policies pushed through OPA's Policy API, a bundle without a revision)
is ``policy_error``. Without it such an answer is recorded with no OPA revision.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from opa_client.opa_async import AsyncOpaClient

from cosigner.core.errors import PolicyError, Unavailable

DEFAULT_OPA_URL = "http://127.0.0.1:8181"
DEFAULT_TIMEOUT_MS = 500


def data_path(entrypoint: str) -> str:
    """``data.cosigner.refunds.decision`` → ``cosigner/refunds/decision``."""
    parts = entrypoint.split(".")
    if len(parts) < 2 or parts[0] != "data" or not all(parts[1:]):
        raise PolicyError(
            f"entrypoint {entrypoint!r} must be data.<path>", code="policy_load_failed"
        )
    return "/".join(parts[1:])


class OpaEngine:
    """Evaluate a rule on a remote OPA server (one per bundle revision)."""

    def __init__(
        self, *, url: str = DEFAULT_OPA_URL, entrypoint: str, timeout_ms: int = DEFAULT_TIMEOUT_MS,
        opa_bundle: str | None = None, require_revision: bool = False,
    ) -> None:
        parts = urlsplit(url)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
        ):
            raise PolicyError(
                f"opa_url {url!r} must be http(s)://host[:port] without a path",
                code="policy_load_failed",
            )
        self.url = url
        self.path = data_path(entrypoint)
        self.timeout_s = timeout_ms / 1000
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = parts.scheme == "https"
        self._clients: dict[asyncio.AbstractEventLoop, AsyncOpaClient] = {}
        self.opa_bundle = opa_bundle
        self.require_revision = require_revision

    @classmethod
    def from_manifest(
        cls, manifest: Any, *, url: str = DEFAULT_OPA_URL, timeout_ms: int = DEFAULT_TIMEOUT_MS
    ) -> OpaEngine:
        return cls(url=url, entrypoint=manifest.entrypoint, timeout_ms=timeout_ms,
                   opa_bundle=manifest.opa_bundle,
                   require_revision=manifest.opa_require_revision)

    async def _client(self) -> AsyncOpaClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            for old_loop in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[old_loop]
            client = AsyncOpaClient(
                host=self._host, port=self._port, ssl=self._ssl, retries=0, timeout=self.timeout_s
            )
            await client._init_session()  # the client's own (async) session set-up
            self._clients[loop] = client
        return client

    async def close(self) -> None:
        """Close the HTTP session of the running loop (others die with their loop)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close_connection()

    async def evaluate(self, input_doc: dict[str, Any]) -> Any:
        """The rule's value for ``input_doc``, or ``None`` when OPA says undefined (see
        :meth:`evaluate_traced`, which also returns what OPA evaluated)."""
        return (await self.evaluate_traced(input_doc))[0]

    async def evaluate_traced(self, input_doc: dict[str, Any]
                              ) -> tuple[Any, dict[str, str] | None]:
        """``(value, revisions)``: the rule's value (``None`` when undefined) and the
        revisions OPA reports for the bundles it evaluated (``{name: revision}``, ``None``
        when it reports none; see module doc).

        Raises:
            Unavailable: ``engine_unavailable`` (down, timeout, 5xx).
            PolicyError: ``policy_error`` (4xx, a body that is not an object, null result,
                a required revision missing).
        """
        try:
            async with asyncio.timeout(self.timeout_s):
                client = await self._client()
                body = await client.query_rule(input_doc, self.path,
                                               query_params={"provenance": "true"})
        except TimeoutError as exc:
            raise Unavailable(
                f"OPA at {self.url} did not answer within {int(self.timeout_s * 1000)} ms",
                code="engine_unavailable",
            ) from exc
        except aiohttp.ContentTypeError as exc:
            raise PolicyError(f"OPA answered a non-JSON body (HTTP {exc.status})") from exc
        except aiohttp.ClientResponseError as exc:
            if exc.status >= 500:
                raise Unavailable(
                    f"OPA answered HTTP {exc.status}", code="engine_unavailable"
                ) from exc
            raise PolicyError(f"OPA answered HTTP {exc.status}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise Unavailable(
                f"OPA at {self.url} is unreachable: {type(exc).__name__}", code="engine_unavailable"
            ) from exc
        except (json.JSONDecodeError, ValueError) as exc:
            raise PolicyError("OPA answered a body that is not JSON") from exc
        if not isinstance(body, dict):
            raise PolicyError(f"OPA answered a {type(body).__name__}, not a JSON object")
        revisions = reported_revisions(body.get("provenance"), self.opa_bundle)
        if revisions is None and self.require_revision:
            which = f"bundle {self.opa_bundle!r}" if self.opa_bundle else "any bundle"
            raise PolicyError(f"OPA did not report the revision of {which}; the bundle "
                              "requires it ([opa] require_revision)")
        if "result" not in body:
            return None, revisions
        if body["result"] is None:
            raise PolicyError("OPA result is null")
        return body["result"], revisions


def reported_revisions(provenance: Any, bundle: str | None) -> dict[str, str] | None:
    """``{name: revision}`` from OPA's ``provenance.bundles`` (non-empty revisions only),
    restricted to ``bundle`` when named; ``None`` when nothing is reported."""
    bundles = provenance.get("bundles") if isinstance(provenance, dict) else None
    if not isinstance(bundles, dict):
        return None
    found = {name: info["revision"] for name, info in bundles.items()
             if isinstance(name, str) and isinstance(info, dict)
             and isinstance(info.get("revision"), str) and info["revision"]}
    if bundle is not None:
        found = {bundle: found[bundle]} if bundle in found else {}
    return dict(sorted(found.items())) or None
