"""The worker's spans for one response: its life from intake to its end.

``request_span_start`` opens ``gpuworker.request`` when the worker takes a
request: a consumer span whose parent is the web tier's enqueue span (the
request's ``traceparent``), so web and worker spans form one trace.
``request_span_end`` closes it at the terminal event and adds the
response's phases as children, from the timestamps the tracker keeps
anyway: ``engine.queued`` (intake to first scheduled), ``engine.prefill``
(to the first token) and ``engine.decode`` (to the end), plus a
``first_token`` event. Nothing is recorded per step or per token, and
nothing at all while tracing is off.

Under ``engine.prefill``, one ``engine.prefill_chunk`` span per engine
step that computed part of the prompt (its positions as attributes), from
the step times the worker notes while tracing is on.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from wire.events import ErrorInfo
from wire.requests import GenerationRequest
from wire.tracing import context_from_traceparent, ns, tracer, tracing_enabled


def request_span_start(
    request: GenerationRequest, *, worker_id: str, model: str, at: float
) -> Span | None:
    """The response's root span on this worker; None while tracing is off."""
    if not tracing_enabled():
        return None
    attributes: dict[str, Any] = {
        "response_id": request.response_id,
        "llm.model": model,
        "llm.tier": request.tier,
        "worker_id": worker_id,
        "llm.prompt_tokens": len(request.prompt_token_ids),
        "llm.max_tokens": request.sampling.max_tokens or 0,
        "llm.service_class": request.service_class.value,
        "messaging.operation.type": "process",
        # Time on the bus: from the web tier's enqueue to this intake.
        "messaging.wait_seconds": round(max(at - request.created_at, 0.0), 6),
    }
    if request.request_id:
        attributes["request_id"] = request.request_id
    return tracer.start_span(
        "gpuworker.request",
        context=context_from_traceparent(request.traceparent),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        start_time=ns(at),
    )


def request_span_end(
    span: Span | None,
    response: Any,
    *,
    outcome: str,
    at: float,
    error: ErrorInfo | None = None,
) -> None:
    """Close the root span with the response's phases as children.

    ``response`` is the tracker's record (added_at, engine_queue_time,
    first_token_at, token counts); ``outcome`` the terminal event's type.
    """
    if span is None:
        return
    parent = trace.set_span_in_context(span)
    # Every span of the request carries its x-request-id.
    request_id = response.request.request_id
    common = {"request_id": request_id} if request_id else {}
    started = response.added_at
    first = response.first_token_at
    scheduled = started + response.engine_queue_time if response.engine_queue_time else None
    queued_until = scheduled or first or at
    _phase("engine.queued", parent, started, queued_until, common)
    if first is not None:
        prefill = {
            **common,
            "llm.prompt_tokens": response.prompt_tokens,
            "llm.cached_tokens": response.cached_tokens,
        }
        prefill_span = _phase("engine.prefill", parent, queued_until, first, prefill)
        chunk_parent = trace.set_span_in_context(prefill_span)
        for positions, chunk_start, chunk_end in response.prefill_chunks:
            chunk = {**common, "llm.chunk.start": positions.start, "llm.chunk.stop": positions.stop}
            _phase("engine.prefill_chunk", chunk_parent, chunk_start, chunk_end, chunk)
        span.add_event("first_token", timestamp=ns(first))
        decode = {**common, "llm.completion_tokens": response.completion_tokens}
        _phase("engine.decode", parent, first, at, decode)
    span.set_attribute("llm.outcome", outcome)
    span.set_attribute("llm.completion_tokens", response.completion_tokens)
    reasons = sorted(set(response.finish_reasons.values()))
    if reasons:
        span.set_attribute("llm.finish_reasons", reasons)
    if "abort" in reasons:
        span.add_event("abort", timestamp=ns(at))
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error.message))
        span.set_attribute("error.type", error.code or error.type or "error")
    span.end(end_time=ns(at))


def _phase(name: str, parent, start: float, end: float, attributes: dict[str, Any]) -> Span:
    child = tracer.start_span(name, context=parent, attributes=attributes, start_time=ns(start))
    child.end(end_time=ns(max(end, start)))
    return child
