"""SSE: a response's events as ``text/event-stream`` frames.

By default each frame is ``data: {json}`` alone, which every client parses
(vLLM's benchmark reader expects nothing else). A client that asks with
``X-Stream-Resumable: 1`` also gets ``id: <seq>`` of the bus event a frame
came from (on the last frame of that event's group), so after losing the
connection it resumes with ``GET /v1/chat/completions/{id}/events`` and
``Last-Event-ID`` and gets exactly the frames after that event (resumes are
always framed with ids). Streams end with ``data: [DONE]``; an error after
the first byte is a ``data: {"error": ...}`` frame before it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from django.http import StreamingHttpResponse

from inference.api.openai_format import ChunkStream
from inference.errors import InvalidRequest
from inference.relay.tap import (
    ResponseTap,
    ShutdownEnding,
    ended_badly,
    failed_error,
    release_db_connection,
    with_headers,
    with_rate_headers,
)
from inference.tool_calls.output import with_tool_calls
from wire.events import Event, Terminal

# An SSE comment this often keeps idle proxies from closing a slow stream
# and makes a vanished client show up as a failed write.
KEEPALIVE_SECONDS = 15.0
# The request header that asks for resumable framing (``id:`` lines).
RESUMABLE_HEADER = "X-Stream-Resumable"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Frames(Protocol):
    """Turns a response's events into the JSON payloads of SSE frames."""

    def payloads(self, event: Event) -> list[dict[str, Any]]: ...


async def stream_response(
    tap: ResponseTap,
    *,
    after_seq: int = 0,
    resumable: bool = False,
    frames: Frames | None = None,
    named_events: bool = False,
    done_marker: bool = True,
) -> StreamingHttpResponse:
    """Answer SSE; waits for the first event so an immediate failure is an HTTP error.

    ``tap``: a ResponseTap or anything reading events like one
    (``next_event``, ``abandon``, ``route``, ``headers``). ``frames``
    renders them (default: ``chat.completion.chunk``); ``named_events``
    adds an ``event: <payload type>`` line (the Responses API's framing),
    ``done_marker`` the closing ``data: [DONE]``; ``resumable`` the
    ``id:`` lines.
    """
    await release_db_connection()
    try:
        first = await tap.next_event()
    except asyncio.CancelledError:
        tap.abandon()
        raise
    if after_seq == 0 and ended_badly(first):
        raise with_rate_headers(failed_error(first), tap)
    route = tap.route
    if frames is None:
        frames = with_tool_calls(
            ChunkStream(
                route.response_id,
                route.model,
                route.created,
                route.n,
                route.include_usage,
                service_tier=route.service_tier,
            ),
            route,
        )
    encoding = _Encoding(resumable=resumable, named_events=named_events, done_marker=done_marker)
    body = _sse_body(tap, first, frames, after_seq, encoding)
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    return with_headers(response, {**SSE_HEADERS, **tap.headers})


@dataclass(slots=True, frozen=True)
class _Encoding:
    resumable: bool
    named_events: bool
    done_marker: bool


async def _sse_body(
    tap: ResponseTap, first: Event, frames: Frames, after_seq: int, encoding: _Encoding
) -> AsyncIterator[str]:
    event: Event | None = first
    try:
        while True:
            if event is None:
                yield ": keep-alive\n\n"
            else:
                seq = event.seq
                payloads = frames.payloads(event)
                terminal = isinstance(event, Terminal)
                local = isinstance(event, ShutdownEnding)
                # ``created`` alone has no frame (the role chunk waits for
                # the first content), so nothing is written for it.
                if (payloads or terminal) and (seq > after_seq or local):
                    data = [json.dumps(p, separators=(",", ":")) for p in payloads]
                    names = [p.get("type") if encoding.named_events else None for p in payloads]
                    if terminal and encoding.done_marker:
                        data.append("[DONE]")
                        names.append(None)
                    # A web-made ending (shutdown) is no bus event: no id a
                    # resume could skip past the real ones with.
                    framed_seq = seq if encoding.resumable and not local else None
                    yield encode_frames(data, framed_seq, event_names=names)
                if terminal:
                    return
            event = await tap.next_event(KEEPALIVE_SECONDS)
    finally:
        # Reached on CancelledError (client disconnected) and on aclose()
        # alike; after a terminal event abandon() does nothing.
        tap.abandon()


def encode_frames(
    frames: list[str], seq: int | None = None, *, event_names: list[str | None] | None = None
) -> str:
    """SSE frames for one event: ``data:`` alone unless ``seq`` (resumable
    streams) or event names are given. The id goes on the last frame, so a
    resume never skips."""
    out = []
    for i, data in enumerate(frames):
        name = event_names[i] if event_names else None
        event_line = f"event: {name}\n" if name else ""
        id_line = f"id: {seq}\n" if seq is not None and i == len(frames) - 1 else ""
        out.append(f"{event_line}{id_line}data: {data}\n\n")
    return "".join(out)


def wants_resumable(value: str | None) -> bool:
    """The ``X-Stream-Resumable`` request header: ``1``/``true`` asks for ``id:`` lines."""
    return (value or "").strip().lower() in ("1", "true", "yes")


def parse_last_event_id(value: str | None) -> int:
    """``Last-Event-ID`` (a seq) as an int; 0 when absent."""
    if value is None or value.strip() == "":
        return 0
    try:
        seq = int(value.strip())
    except ValueError:
        seq = -1
    if seq < 0:
        raise InvalidRequest("Last-Event-ID must be a non-negative integer.", param="Last-Event-ID")
    return seq
