"""Log lines as JSON with the request's context, or readable for a terminal."""

import io
import json
import logging

import pytest

from tests.tracing_helpers import recorded_spans  # noqa: F401 (fixture)
from wire import logs
from wire.tracing import tracer


def _log(fmt: str, message: str, *args, exc_info=None) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.formatter(fmt))
    logger = logging.getLogger(f"tests.wire.logs.{fmt}")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning(message, *args, exc_info=exc_info)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_a_json_line_carries_the_bound_context_and_the_trace(recorded_spans):  # noqa: F811
    with (
        logs.bound(request_id="req_1", tenant=7, model="m", worker="w-1"),
        tracer.start_as_current_span("work") as span,
    ):
        line = json.loads(_log("json", "served %d tokens", 5))
    ids = span.get_span_context()
    assert line["event"] == "served 5 tokens" and line["level"] == "warning"
    assert (line["request_id"], line["tenant"], line["model"], line["worker"]) == (
        "req_1",
        7,
        "m",
        "w-1",
    )
    assert line["trace_id"] == f"{ids.trace_id:032x}"
    assert line["span_id"] == f"{ids.span_id:016x}"
    assert line["logger"] == "tests.wire.logs.json" and line["timestamp"].endswith("Z")


def test_context_ends_with_its_block():
    logs.clear()
    with logs.bound(request_id="req_2"):
        assert logs.context()["request_id"] == "req_2"
    line = json.loads(_log("json", "later"))
    assert "request_id" not in line and "trace_id" not in line


def test_exceptions_are_one_json_field():
    try:
        raise ValueError("boom")
    except ValueError as exc:
        line = json.loads(_log("json", "failed", exc_info=exc))
    assert "ValueError: boom" in line["exception"]


def test_the_console_format_is_one_readable_line():
    with logs.bound(request_id="req_3"):
        out = _log("console", "hello %s", "there")
    assert out.count("\n") == 1
    assert "hello there" in out and "request_id=req_3" in out and "warning" in out


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="LOG_FORMAT"):
        logs.formatter("xml")
