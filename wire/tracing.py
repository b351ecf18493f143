"""Traces across processes: one trace per request, web -> Redis -> worker -> engine.

Each process calls ``tracing_configure`` once at start-up (the web from
``config.asgi``, a worker from its command). Tracing is off unless the
standard OpenTelemetry environment turns it on:

- ``OTEL_TRACES_EXPORTER=otlp`` (or ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set): OTLP over HTTP/protobuf,
  configured by the exporter's own ``OTEL_EXPORTER_OTLP_*`` variables;
  ``console`` prints spans; ``none`` or ``OTEL_SDK_DISABLED=true``: off.
- ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
  ``OTEL_TRACES_SAMPLER[_ARG]`` and ``OTEL_BSP_*`` work as anywhere else.
- ``TRACES_FILE=PATH`` (ours) also appends each span to PATH as one JSON
  line when it ends: tests and local debugging.

The web tier's enqueue span travels to the worker in
``GenerationRequest.traceparent`` (W3C trace context), so the worker's
spans are its children and the whole request is one trace. Every span
records the request's ``x-request-id`` as ``request_id``: from the context
bound with ``wire.logs.bind`` when the span starts (the web), or set by its
creator (the worker, from ``GenerationRequest.request_id``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from wire import logs

# Spans of every process come from this one tracer (a proxy until a
# provider is installed, and a no-op without one).
tracer = trace.get_tracer("llm_platform")

_propagator = TraceContextTextMapPropagator()
_lock = threading.Lock()
_provider: TracerProvider | None = None
_from_env = False


def tracing_enabled() -> bool:
    """Whether this process records spans (lets hot paths skip span work)."""
    return _provider is not None


def tracing_configure(*, service_name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Install the process's tracer provider if the environment asks for one.

    Idempotent; ``service_name`` applies unless ``OTEL_SERVICE_NAME`` is
    set. Returns whether tracing is on.
    """
    global _from_env
    env = os.environ if environ is None else environ
    with _lock:
        if _from_env:
            return _provider is not None
        _from_env = True
        processors = _processors_from(env)
        if not processors:
            return _provider is not None
        provider = _install(service_name, env)
        for processor in processors:
            provider.add_span_processor(processor)
        return True


def tracing_export_to(exporter: SpanExporter, *, service_name: str = "llm-platform") -> None:
    """Also hand every span to ``exporter`` as it ends (tests: in-memory)."""
    with _lock:
        _install(service_name, os.environ).add_span_processor(SimpleSpanProcessor(exporter))


def _processors_from(env: Mapping[str, str]) -> list[SpanProcessor]:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not names and (
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        names = "otlp"
    processors: list[SpanProcessor] = []
    for name in filter(None, (n.strip() for n in names.split(","))):
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            processors.append(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name != "none":
            raise ValueError(f"OTEL_TRACES_EXPORTER: unsupported exporter {name!r}")
    if env.get("TRACES_FILE"):
        processors.append(SimpleSpanProcessor(_file_exporter(env["TRACES_FILE"])))
    return processors


def _file_exporter(path: str) -> SpanExporter:
    # Line-buffered: each span is on disk as soon as it ends.
    out = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (lives with the process)
    return ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")


def _install(service_name: str, env: Mapping[str, str]) -> TracerProvider:
    global _provider
    if _provider is None:
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            _provider = current  # someone installed one first: share it
        else:
            attributes = {} if env.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
            _provider = TracerProvider(resource=Resource.create(attributes))
            trace.set_tracer_provider(_provider)
        _provider.add_span_processor(_RequestIdProcessor())
    return _provider


class _RequestIdProcessor(SpanProcessor):
    """Records the bound ``request_id`` on every span as it starts."""

    def on_start(self, span, parent_context: Context | None = None) -> None:
        request_id = logs.context().get("request_id")
        if request_id is not None:
            span.set_attribute("request_id", request_id)


def traceparent_current() -> str | None:
    """The current span's W3C ``traceparent``; None when nothing is traced."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def context_from_headers(headers: Mapping[str, str]) -> Context:
    """The trace context a caller sent (``traceparent``/``tracestate``), if any."""
    return _propagator.extract({k.lower(): v for k, v in headers.items()})


def context_from_traceparent(traceparent: str | None) -> Context | None:
    """A context whose parent is the span ``traceparent`` names."""
    if not traceparent:
        return None
    return _propagator.extract({"traceparent": traceparent})


@dataclass(slots=True, frozen=True)
class TraceContext:
    """Where a request sits in the logs and traces: the ``x-request-id`` of
    the call that asked for it and the W3C ``traceparent`` of its span."""

    request_id: str | None = None
    traceparent: str | None = None

    @classmethod
    def current(cls) -> TraceContext:
        """The calling code's: its bound request id and current span."""
        return cls(logs.context().get("request_id"), traceparent_current())

    @contextmanager
    def attached(self) -> Iterator[None]:
        """Run a block as part of this trace when nothing is traced around it
        (a request made in one place and served from another, such as a
        batch line); inside a traced call, its own span stays the parent."""
        parent = None
        if not trace.get_current_span().get_span_context().is_valid:
            parent = context_from_traceparent(self.traceparent)
        token = otel_context.attach(parent) if parent is not None else None
        try:
            with logs.bound(**({"request_id": self.request_id} if self.request_id else {})):
                yield
        finally:
            if token is not None:
                otel_context.detach(token)


def ns(seconds: float) -> int:
    """Wall-clock seconds as OpenTelemetry's nanosecond timestamps."""
    return int(seconds * 1e9)
