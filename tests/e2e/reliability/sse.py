"""A small SSE client over httpx for the live topology: frames with their ids."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from tests.e2e.flows import MODEL

LONG_STORY = [{"role": "user", "content": "Write a very long story about a dragon and a knight."}]


@dataclass(slots=True)
class Frame:
    """One SSE event: its ``id:`` (the bus seq, on an event's last frame) and data."""

    id: int | None
    data: str

    @property
    def done(self) -> bool:
        return self.data == "[DONE]"

    def json(self) -> dict[str, Any]:
        return json.loads(self.data)

    @property
    def error(self) -> dict[str, Any] | None:
        return None if self.done else self.json().get("error")


def resumable_headers(live) -> dict[str, str]:
    """The live topology's auth headers plus the opt-in to ``id:`` lines."""
    return {**live.headers, "X-Stream-Resumable": "1"}


def frames(response: httpx.Response) -> Iterator[Frame]:
    """The frames of a streaming response as they arrive (comments skipped)."""
    event_id, data = None, None
    for line in response.iter_lines():
        if line == "":
            if data is not None:
                yield Frame(event_id, data)
            event_id, data = None, None
        elif line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            data = line[6:]
    if data is not None:
        yield Frame(event_id, data)


def chat_body(**overrides: Any) -> dict[str, Any]:
    """A streamed chat request that generates long enough to be interrupted."""
    return {
        "model": MODEL,
        "messages": LONG_STORY,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 1500,
        "temperature": 0,
        # One logprobs entry per token: the client can count what it received.
        "logprobs": True,
        **overrides,
    }


def tokens_in(frame: Frame) -> int:
    if frame.done or frame.error:
        return 0
    return sum(len((c.get("logprobs") or {}).get("content") or []) for c in frame.json()["choices"])


def response_id_of(first: Frame) -> str:
    return first.json()["id"]
