"""Structured logs: one JSON object per line, or a readable console line.

``formatter`` is the ``logging.Formatter`` every process's logging config
names (Django's ``LOGGING``: ``"()": "wire.logs.formatter"``), so all the
platform's standard-library loggers go through it, web and worker alike.
``LOG_FORMAT=json`` writes JSON lines (the multi-process default);
``console`` keeps ``bin/run``'s terminal readable.

Each line carries the context of the work it belongs to: ``request_id``,
``tenant``, ``model`` and ``worker``, bound with ``bind`` where they become
known (the web's request middleware, the request path, the worker loop's
threads), and ``trace_id``/``span_id`` of the current span. The context
lives in contextvars, so it follows a request into the tasks it spawns and
never leaks into another request's task; the same fields are what
``wire.tracing`` records on spans.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog
from opentelemetry import trace

# The context fields a log line may carry, in the order they are bound.
CONTEXT_FIELDS = ("request_id", "tenant", "model", "worker")


def bind(**fields: Any) -> None:
    """Add fields to the current context's log lines (and spans: request_id)."""
    structlog.contextvars.bind_contextvars(**fields)


def clear() -> None:
    """Forget the current context's fields (a new request on a reused thread)."""
    structlog.contextvars.clear_contextvars()


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """``bind`` for the duration of a block."""
    with structlog.contextvars.bound_contextvars(**fields):
        yield


def context() -> dict[str, Any]:
    """The fields bound in the current context."""
    return structlog.contextvars.get_contextvars()


def _add_trace_ids(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        event.setdefault("trace_id", trace.format_trace_id(span_context.trace_id))
        event.setdefault("span_id", trace.format_span_id(span_context.span_id))
    return event


def formatter(fmt: str = "console") -> logging.Formatter:
    """The platform's log formatter: ``fmt`` is ``json`` or ``console``."""
    if fmt not in ("json", "console"):
        raise ValueError(f"LOG_FORMAT must be json or console, not {fmt!r}")
    pre_chain = [
        structlog.contextvars.merge_contextvars,
        _add_trace_ids,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if fmt == "json":
        render = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        # Plain tracebacks: readable in a terminal and in a captured log file.
        console = structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )
        render = [console]
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=pre_chain,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
    )
