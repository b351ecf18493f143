"""Where one streamed request's time to first token went, stage by stage.

From the spans of the request's trace (wire.tracing's JSON, as
``TRACES_FILE`` writes them: web and worker processes alike) and the
client's two wall-clock times (request sent, first chunk with choices
received), the request's path as a chain of marks, each the end of a
stage: the stages add up to the client's TTFT exactly, and whatever is not
inside a span (a thread hop, a gap between two spans) counts with the
stage after it. A stage that ran alongside the one before it (the
tokenizer runs beside the safety screen) counts only for the time it
outlasted it.

The chain, in the order a request meets it:

- ``web.receive``: the client's send to the HTTP server span's start
  (connection, Daphne's parse, the middleware before tracing);
- ``auth``: the API key's lookup (span ``auth``);
- ``request.build``: body validation and the chat schema to the internal
  request (span ``request.build``, chat only);
- ``model.lookup``, ``limits.count``, ``safety.screen``, ``prompt.prepare``
  (concurrent with the screen), ``limits.admit``:
  ``services.generation_start``'s steps, one span each;
- ``dispatch``: routing and the queue-wait check, up to the enqueue
  (span ``dispatch``, to the start of ``bus.submit`` inside it);
- ``bus.wait``: the enqueue's round trip to Redis and the worker's intake
  (``gpuworker.request``'s start); the worker may take the request before
  the web has the reply, so this one starts at the enqueue's start;
- ``engine.queued``, ``engine.prefill``: the worker's phases, up to the
  engine's first token;
- ``relay.hop``: the first token to the web's relay reading it off the bus
  (the worker's detokenize and publish, Redis, the web's shared XREAD);
- ``sse.frame``: the relay to the first SSE frame handed to the server
  (``first_chunk`` on the HTTP span);
- ``web.write``: that frame to the client.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime

# (stage, span whose time ends it, "start" | "end" | an event's name)
CHAIN: tuple[tuple[str, str, str], ...] = (
    ("web.receive", "http", "start"),
    ("auth", "auth", "end"),
    ("request.build", "request.build", "end"),
    ("model.lookup", "model.lookup", "end"),
    ("limits.count", "limits.count", "end"),
    ("safety.screen", "safety.screen", "end"),
    ("prompt.prepare", "prompt.prepare", "end"),
    ("limits.admit", "limits.admit", "end"),
    ("dispatch", "bus.submit", "start"),
    ("bus.wait", "gpuworker.request", "start"),
    ("engine.queued", "engine.queued", "end"),
    ("engine.prefill", "engine.prefill", "end"),
    ("relay.hop", "relay", "first_token"),
    ("sse.frame", "http", "first_chunk"),
)
STAGES: tuple[str, ...] = (*(stage for stage, _, _ in CHAIN), "web.write")


class IncompleteTrace(ValueError):
    """A trace without one of the chain's spans or events."""


@dataclass(slots=True, frozen=True)
class Span:
    """One span of the JSON export, its times as Unix seconds."""

    name: str
    trace_id: str
    parent_id: str | None
    kind: str
    start: float
    end: float
    attributes: dict
    events: dict[str, float]

    @classmethod
    def from_json(cls, span: dict) -> Span:
        return cls(
            name=span["name"],
            trace_id=span["context"]["trace_id"],
            parent_id=span.get("parent_id"),
            kind=span.get("kind", ""),
            start=_seconds(span["start_time"]),
            end=_seconds(span["end_time"]),
            attributes=span.get("attributes") or {},
            # The first of each name: the chain's events happen once.
            events={
                e["name"]: _seconds(e["timestamp"]) for e in reversed(span.get("events") or [])
            },
        )


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def by_trace(spans: list[Span]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for span in spans:
        out.setdefault(span.trace_id, []).append(span)
    return out


def trace_of_response(traces: dict[str, list[Span]], response_id: str) -> list[Span] | None:
    """The trace whose relay (web) or worker span carries ``response_id``."""
    for spans in traces.values():
        if any(s.attributes.get("response_id") == response_id for s in spans):
            return spans
    return None


def stages_of(spans: list[Span], *, sent_at: float, first_chunk_at: float) -> dict[str, float]:
    """Each stage's milliseconds for one request (``STAGES``' order); they
    sum to ``first_chunk_at - sent_at``. Raises IncompleteTrace when a mark
    is missing."""
    named: dict[str, Span] = {}
    for span in spans:
        # The HTTP server span is the trace's root; its name carries the route.
        key = "http" if span.kind.endswith("SERVER") and span.parent_id is None else span.name
        named.setdefault(key, span)
    marks = [sent_at]
    for stage, name, point in CHAIN:
        span = named.get(name)
        if span is None:
            raise IncompleteTrace(f"no {name!r} span for stage {stage!r}")
        if point == "start":
            at = span.start
        elif point == "end":
            at = span.end
        elif point in span.events:
            at = span.events[point]
        else:
            raise IncompleteTrace(f"no {point!r} event on {name!r} for stage {stage!r}")
        # A step that ran alongside the one before (the tokenizer beside
        # the screen) and ended first was hidden by it: it costs 0.
        marks.append(max(at, marks[-1]))
    marks.append(max(first_chunk_at, marks[-1]))
    return {
        stage: round((after - before) * 1000, 2)
        for stage, before, after in zip(STAGES, marks[:-1], marks[1:], strict=True)
    }


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile, linear between ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    at = (len(ordered) - 1) * q
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (at - low), 2)


def summary(rows: list[dict[str, float]], keys: tuple[str, ...]) -> dict[str, dict]:
    """p50, p95 and mean of each key over ``rows``."""
    return {
        key: {
            "p50": percentile([r[key] for r in rows], 0.5),
            "p95": percentile([r[key] for r in rows], 0.95),
            "mean": round(statistics.fmean(r[key] for r in rows), 2) if rows else None,
        }
        for key in keys
    }
