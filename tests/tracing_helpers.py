"""Recording this process's spans in memory, for tests.

A process has one tracer provider for good, so the recorder is installed
once, on first use, and keeps spans only while a test holds the
``recorded_spans`` fixture; from then on the rest of the session runs with
tracing on (spans are dropped when nobody records), which also checks that
tracing never changes what the code under it does.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from wire.tracing import tracing_export_to


class _Recorder(SpanExporter):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[ReadableSpan] | None = None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.lock:
            if self.spans is not None:
                self.spans.extend(spans)
        return SpanExportResult.SUCCESS


_recorder: _Recorder | None = None


@pytest.fixture
def recorded_spans() -> list[ReadableSpan]:
    """The spans that end during the test, in the order they end."""
    global _recorder
    if _recorder is None:
        _recorder = _Recorder()
        tracing_export_to(_recorder, service_name="tests")
    spans: list[ReadableSpan] = []
    _recorder.spans = spans
    yield spans
    _recorder.spans = None


PREFILL_CHUNK = "engine.prefill_chunk"


def spans_of_trace(spans: list[ReadableSpan], trace_id: int) -> dict[str, ReadableSpan]:
    """The trace's spans by name: names are unique within one request's
    trace, but for the per-step prefill chunks (``prefill_chunks_of_trace``)."""
    found = [s for s in spans if s.context.trace_id == trace_id and s.name != PREFILL_CHUNK]
    by_name = {s.name: s for s in found}
    assert len(by_name) == len(found), sorted(s.name for s in found)
    return by_name


def prefill_chunks_of_trace(spans: list[ReadableSpan], trace_id: int) -> list[ReadableSpan]:
    """The trace's ``engine.prefill_chunk`` spans, in prompt order."""
    found = [s for s in spans if s.context.trace_id == trace_id and s.name == PREFILL_CHUNK]
    return sorted(found, key=lambda s: s.attributes["llm.chunk.start"])
