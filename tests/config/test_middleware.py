"""The request's server span: a caller's traceparent, the route, the status."""

# ruff: noqa: F811 (fixture imported by name)

import pytest
from opentelemetry.trace import SpanKind

from tests.plugins.asgi_client import ASGIStream
from tests.tracing_helpers import recorded_spans  # noqa: F401

pytestmark = pytest.mark.asyncio

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_a_callers_traceparent_parents_the_request_span(recorded_spans):
    stream = ASGIStream("GET", "/healthz", {"traceparent": CALLER, "x-request-id": "req_mw"}, b"")
    await stream.read_all()
    assert stream.status == 200
    (span,) = [s for s in recorded_spans if s.kind == SpanKind.SERVER]
    assert span.name == "GET /healthz"
    assert f"{span.context.trace_id:032x}" == CALLER.split("-")[1]
    assert f"{span.parent.span_id:016x}" == CALLER.split("-")[2]
    assert span.attributes["http.route"] == "/healthz"
    assert span.attributes["http.response.status_code"] == 200
    assert span.attributes["request_id"] == "req_mw"
