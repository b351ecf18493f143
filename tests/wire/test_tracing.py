"""Tracing set-up from the OTEL_* environment, and the traceparent between processes."""

import json
import subprocess
import sys
from pathlib import Path

from opentelemetry import trace

from tests.tracing_helpers import recorded_spans  # noqa: F401 (fixture)
from wire import logs
from wire.tracing import context_from_traceparent, traceparent_current, tracer

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
from wire import logs
from wire.tracing import tracer, tracing_configure, tracing_enabled
print(json.dumps(tracing_configure(service_name="svc")))
with logs.bound(request_id="req_7"):
    with tracer.start_as_current_span("outer"):
        with tracer.start_as_current_span("inner"):
            pass
"""


def _run(env: dict[str, str]) -> str:
    base = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_tracing_is_off_without_otel_settings():
    assert _run({}) == "false"
    assert _run({"OTEL_TRACES_EXPORTER": "none"}) == "false"
    assert _run({"OTEL_SDK_DISABLED": "true", "TRACES_FILE": "/nonexistent/x"}) == "false"


def test_a_traces_file_gets_one_json_line_per_span(tmp_path):
    """Spans are on disk as they end, with the service name and the request id."""
    path = tmp_path / "spans.jsonl"
    assert _run({"TRACES_FILE": str(path)}) == "true"
    spans = [json.loads(line) for line in path.read_text().splitlines()]
    assert [s["name"] for s in spans] == ["inner", "outer"]
    inner, outer = spans
    assert inner["parent_id"] == outer["context"]["span_id"]
    assert inner["context"]["trace_id"] == outer["context"]["trace_id"]
    assert {s["attributes"]["request_id"] for s in spans} == {"req_7"}
    assert outer["resource"]["attributes"]["service.name"] == "svc"


def test_the_service_name_of_the_environment_wins(tmp_path):
    path = tmp_path / "spans.jsonl"
    _run({"TRACES_FILE": str(path), "OTEL_SERVICE_NAME": "from-env"})
    span = json.loads(path.read_text().splitlines()[0])
    assert span["resource"]["attributes"]["service.name"] == "from-env"


def test_a_traceparent_makes_the_remote_span_the_parent(recorded_spans):  # noqa: F811
    """What the worker does with GenerationRequest.traceparent."""
    with logs.bound(request_id="req_9"), tracer.start_as_current_span("web") as web:
        traceparent = traceparent_current()
    assert traceparent is not None and traceparent.startswith("00-")
    remote = tracer.start_span("worker", context=context_from_traceparent(traceparent))
    remote.end()
    assert remote.parent.span_id == web.get_span_context().span_id
    assert remote.context.trace_id == web.get_span_context().trace_id
    assert dict(recorded_spans[0].attributes) == {"request_id": "req_9"}


def test_nothing_is_propagated_outside_a_span():
    assert trace.get_current_span().get_span_context().is_valid is False
    assert traceparent_current() is None
    assert context_from_traceparent(None) is None


def test_an_otlp_endpoint_turns_on_the_otlp_exporter():
    """The standard variables pick the exporter; an unknown name is an error."""
    import pytest
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from wire.tracing import _processors_from

    (processor,) = _processors_from({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    try:
        assert isinstance(processor.span_exporter, OTLPSpanExporter)
    finally:
        processor.shutdown()
    assert _processors_from({"OTEL_TRACES_EXPORTER": "none"}) == []
    with pytest.raises(ValueError, match="zipkin"):
        _processors_from({"OTEL_TRACES_EXPORTER": "zipkin"})
