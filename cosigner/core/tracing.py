"""OpenTelemetry traces, optional (extra ``cosigner[otel]``; README § Operations, Tracing).

Off unless the standard variables ask for it: ``OTEL_TRACES_EXPORTER`` (``otlp`` or
``console``) or an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), and ``OTEL_SDK_DISABLED`` not ``true``.
:func:`configure` (called by ``create_app``) then installs the SDK's tracer provider with
a batch span processor; the exporter reads the other ``OTEL_*`` variables itself.

While off, :func:`span` returns one shared null context: no span object, no context
switch, nothing allocated on the hot path. The W3C ``traceparent`` of an incoming
request is read by :mod:`cosigner.http.telemetry` (:func:`extract`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

log = logging.getLogger("cosigner.tracing")

_NULL: AbstractContextManager[Any] = contextlib.nullcontext()
_tracer: Any = None


def enabled() -> bool:
    """Whether spans are recorded in this process."""
    return _tracer is not None


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(exporter or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure(provider: Any = None) -> bool:
    """Turn tracing on: with ``provider`` (a test's), or from the ``OTEL_*`` variables.

    Returns whether tracing is on. Without the ``otel`` extra installed a configured
    environment logs one warning and stays off (a deployment never fails for it).
    """
    global _tracer
    if provider is None and not wanted():
        return enabled()
    try:
        from opentelemetry import trace
    except ImportError:
        log.warning("OTEL_* variables are set but opentelemetry is not installed "
                    "(pip install 'cosigner[otel]'); tracing stays off")
        return False
    if provider is None:
        provider = _provider_from_environment()
        if provider is None:
            return False
        trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer("cosigner")
    return True


def disable() -> None:
    """Stop recording spans (tests)."""
    global _tracer
    _tracer = None


def _provider_from_environment() -> Any:
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning("OTEL_* variables are set but opentelemetry-sdk is not installed "
                    "(pip install 'cosigner[otel]'); tracing stays off")
        return None
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    exporter: Any
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("OTLP exporter not installed (pip install 'cosigner[otel]'); "
                        "tracing stays off")
            return None
        exporter = OTLPSpanExporter()
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME",
                                                               "cosigner")})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def span(name: str, attributes: dict[str, Any] | None = None,
         context: Any = None, server: bool = False) -> AbstractContextManager[Any]:
    """A span as the current one (yields it), or the shared null context when off."""
    if _tracer is None:
        return _NULL
    kind: Any = None
    if server:
        from opentelemetry.trace import SpanKind

        kind = SpanKind.SERVER
    kwargs: dict[str, Any] = {"attributes": attributes, "context": context}
    if kind is not None:
        kwargs["kind"] = kind
    return _tracer.start_as_current_span(name, **kwargs)  # type: ignore[no-any-return]


def extract(headers: Mapping[str, str]) -> Any:
    """The parent context named by a W3C ``traceparent`` header (None when off)."""
    if _tracer is None or "traceparent" not in headers:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(dict(headers))


def current_trace_id() -> str | None:
    """The current span's trace id (32 hex digits), or None when no span records."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def set_attributes(current: Any, attributes: dict[str, Any]) -> None:
    """Set attributes on a span yielded by :func:`span` (no-op for the null context)."""
    if current is not None:
        current.set_attributes(attributes)
