"""Web and worker in one process: one trace per request, ids in logs, one /metrics.

The web tier and a real ``WorkerLoop`` (the demo engine) share this
process and the in-process bus, as in embedded mode; spans are recorded
in memory. tests/e2e/test_observability.py checks the same trace across
real processes.
"""

# Fixtures come from other packages' conftests, imported by name.
# ruff: noqa: F401, F811

from __future__ import annotations

import io
import json
import logging
import threading
import time
import uuid

import pytest
from asgiref.sync import sync_to_async
from opentelemetry.trace import SpanKind

from bench.ttft_stages import STAGES, Span, stages_of
from gpuworkers.worker import WorkerLoop
from inference.relay import tap as relay
from tests.helpers import async_wait_until
from tests.plugins.asgi_client import asgi_post, sse_events
from tests.plugins.request_path import DEMO
from tests.serving import serving_worker
from tests.tracing_helpers import prefill_chunks_of_trace, recorded_spans, spans_of_trace
from wire import logs
from wire.bus import get_worker_bus

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]

WORKER_SPANS = {"gpuworker.request", "engine.queued", "engine.prefill", "engine.decode"}
WEB_SPANS = {"POST /v1/chat/completions", "dispatch", "bus.submit", "relay", "usage.settle"}
# The web's steps before the enqueue, one span each (bench.ttft_stages).
STAGE_SPANS = {
    "auth",
    "request.build",
    "model.lookup",
    "limits.count",
    "safety.screen",
    "prompt.prepare",
    "limits.admit",
    "route.save",
}


@pytest.fixture
def worker(engine, memory_bus):
    """The demo engine serving the catalog's demo model on the in-process bus."""
    with serving_worker(engine, DEMO, "trace-worker") as loop:
        yield loop


@pytest.fixture
def json_log():
    """What the relay logs during the test, as the platform's JSON lines."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.formatter("json"))
    logger = logging.getLogger("inference.relay.tap")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    logger.removeHandler(handler)
    logger.setLevel(level)


async def test_one_streamed_request_is_one_trace_from_http_to_engine(
    worker,
    api_key_factory,
    demo_model,
    recorded_spans,
    json_log,
):
    """HTTP > dispatch > bus.submit > gpuworker.request > engine phases; relay > usage.settle."""
    _, key = await sync_to_async(api_key_factory)(tier="pro")
    request_id = f"req_trace_{uuid.uuid4().hex}"
    # Long enough for several prefill chunks under the engine's 128-token budget.
    content = f"Hi ({request_id}). " + "Say something about the sea and ships. " * 40
    body = {"model": DEMO, "messages": [{"role": "user", "content": content}], "stream": True}
    stream = asgi_post(
        "/v1/chat/completions", key, {**body, "max_tokens": 4}, **{"x-request-id": request_id}
    )
    frames = sse_events(await stream.read_all())
    assert stream.status == 200 and frames[-1][1] == "[DONE]"
    await relay.drain_background()
    # The HTTP span ends with the stream's last byte.
    http = await async_wait_until(
        lambda: next((s for s in recorded_spans if s.kind == SpanKind.SERVER), None)
    )

    trace = spans_of_trace(recorded_spans, http.context.trace_id)
    assert set(trace) == WEB_SPANS | STAGE_SPANS | WORKER_SPANS
    parent_of = {name: span.parent.span_id if span.parent else None for name, span in trace.items()}
    span_id = {name: span.context.span_id for name, span in trace.items()}
    assert parent_of["POST /v1/chat/completions"] is None
    for stage in STAGE_SPANS:
        assert parent_of[stage] == span_id["POST /v1/chat/completions"], stage
    assert parent_of["dispatch"] == parent_of["relay"] == span_id["POST /v1/chat/completions"]
    assert parent_of["bus.submit"] == span_id["dispatch"]
    # The worker's span hangs off the enqueue, through the request's traceparent.
    assert parent_of["gpuworker.request"] == span_id["bus.submit"]
    for phase in ("engine.queued", "engine.prefill", "engine.decode"):
        assert parent_of[phase] == span_id["gpuworker.request"]
    assert parent_of["usage.settle"] == span_id["relay"]
    assert (trace["bus.submit"].kind, trace["gpuworker.request"].kind) == (
        SpanKind.PRODUCER,
        SpanKind.CONSUMER,
    )
    # The phases follow each other: queued, prefill up to the first token, decode.
    queued, prefill, decode = (trace[f"engine.{p}"] for p in ("queued", "prefill", "decode"))
    assert queued.end_time <= prefill.start_time
    assert prefill.end_time == decode.start_time <= decode.end_time
    assert [e.name for e in trace["gpuworker.request"].events] == ["first_token"]
    assert trace["engine.decode"].attributes["llm.completion_tokens"] == 4
    # One span per engine step that computed part of the prompt, under the
    # prefill span: together they cover the prompt after its cached prefix.
    chunks = prefill_chunks_of_trace(recorded_spans, http.context.trace_id)
    assert len(chunks) >= 3
    assert {c.parent.span_id for c in chunks} == {prefill.context.span_id}
    bounds = [(c.attributes["llm.chunk.start"], c.attributes["llm.chunk.stop"]) for c in chunks]
    assert bounds[0][0] == prefill.attributes["llm.cached_tokens"]
    assert bounds[-1][1] == prefill.attributes["llm.prompt_tokens"]
    assert all(stop == start for (_, stop), (start, _) in zip(bounds, bounds[1:], strict=False))
    assert all(stop - start <= 128 for start, stop in bounds)
    assert all(c.attributes["request_id"] == request_id for c in chunks)
    assert trace["gpuworker.request"].attributes["worker_id"] == worker.worker_id
    assert {span.attributes.get("request_id") for span in trace.values()} == {request_id}

    (line,) = [entry for entry in json_log() if entry.get("request_id") == request_id]
    assert line["trace_id"] == f"{http.context.trace_id:032x}"
    assert (line["model"], line["worker"]) == (DEMO, worker.worker_id)
    assert isinstance(line["tenant"], int) and "completed" in line["event"]


async def test_the_embedded_workers_metrics_are_in_the_webs_metrics(
    worker, api_key_factory, demo_model
):
    """No metrics port in embedded mode: the web's /metrics carries the worker's series."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.plugins.asgi_client import ASGIStream

    async def ttft_count() -> float:
        stream = ASGIStream("GET", "/metrics", {}, b"")
        text = (await stream.read_all()).decode()
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "vllm:time_to_first_token_seconds_count" and s.labels["model_name"] == DEMO
        )

    _, key = await sync_to_async(api_key_factory)(tier="pro")
    before = await ttft_count()
    body = {"model": DEMO, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    stream = asgi_post("/v1/chat/completions", key, body)
    assert json.loads(await stream.read_all())["object"] == "chat.completion"
    assert await ttft_count() == before + 1


async def test_the_trace_of_a_streamed_request_has_every_stage_of_its_ttft(
    worker, api_key_factory, demo_model, recorded_spans
):
    """bench.ttft_trace's chain, from client send to first chunk, in one real trace."""
    _, key = await sync_to_async(api_key_factory)(tier="pro")
    body = {
        "model": DEMO,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "stream": True,
        "max_tokens": 3,
    }
    sent_at = time.time()
    stream = asgi_post("/v1/chat/completions", key, body)
    frames = sse_events(await stream.read_all())
    read_at = time.time()
    assert stream.status == 200 and frames[-1][1] == "[DONE]"
    await relay.drain_background()
    http = await async_wait_until(
        lambda: next((s for s in recorded_spans if s.kind == SpanKind.SERVER), None)
    )
    spans = [
        Span.from_json(json.loads(s.to_json()))
        for s in recorded_spans
        if s.context.trace_id == http.context.trace_id
    ]
    # The chain's marks are in order: no stage is missing, none negative.
    stages = stages_of(spans, sent_at=sent_at, first_chunk_at=read_at)
    assert list(stages) == list(STAGES)
    assert min(stages.values()) >= 0
    assert sum(stages.values()) == pytest.approx((read_at - sent_at) * 1000, abs=0.05)
    assert [e.name for e in http.events] == ["first_chunk"]
    relay_span = next(s for s in recorded_spans if s.name == "relay")
    assert [e.name for e in relay_span.events] == ["first_token"]
