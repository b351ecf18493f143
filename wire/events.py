"""The events on a response stream: their types and builders.

Stream contract (docs/architecture.md, "Stream contract"): every response
has one id; its events are ``created``, then ``delta`` events, then exactly
one terminal event (``completed``, ``incomplete``, ``failed`` or
``cancelled``). Every event carries ``seq``, rising by one from 1
(``created``), so a client can resume after the last sequence number it saw.

The worker produces these and the web tier's relay consumes them:

- ``created``: seq 1, response_id, model, worker_id, created (unix
  seconds), prompt_tokens.
- ``delta``: choices, each ``{index, text, token_ids, logprobs,
  finish_reason}``; a choice's finish_reason ("stop" or "length") is set on
  its last delta only.
- terminal (``completed``, ``incomplete``, ``failed``, ``cancelled``): usage,
  metrics, finish_reasons keyed by the choice index as a string, and
  ``error`` on ``failed`` only.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any


class EventType(StrEnum):
    CREATED = "created"
    DELTA = "delta"
    COMPLETED = "completed"  # finish_reason stop or length
    INCOMPLETE = "incomplete"  # content_filter
    FAILED = "failed"  # worker lost, internal error
    CANCELLED = "cancelled"  # client left or asked to stop


TERMINAL_EVENTS = frozenset(
    {EventType.COMPLETED, EventType.INCOMPLETE, EventType.FAILED, EventType.CANCELLED}
)

WORKER_LOST_MESSAGE = "The worker serving this request was lost"


def error_body(
    message: str, *, type: str = "server_error", code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """An OpenAI-shaped error object, as carried by ``failed`` events."""
    return {"message": message, "type": type, "param": param, "code": code}


def worker_lost_error() -> dict[str, Any]:
    return error_body(WORKER_LOST_MESSAGE, code="worker_lost")


def retries_spent_error(deliveries: int) -> dict[str, Any]:
    """A request whose workers died before it started, ``deliveries`` times."""
    message = (
        f"{WORKER_LOST_MESSAGE} before it started, {deliveries} times;"
        " it was not tried again (retry budget spent)"
    )
    return error_body(message, code="worker_lost")


def created_event(
    *, response_id: str, model: str, worker_id: str, prompt_tokens: int
) -> dict[str, Any]:
    return {
        "type": EventType.CREATED.value,
        "seq": 1,
        "response_id": response_id,
        "model": model,
        "worker_id": worker_id,
        "created": int(time.time()),
        "prompt_tokens": prompt_tokens,
    }


def delta_event(
    seq: int, choices: list[dict[str, Any]], prompt_logprobs: list | None = None
) -> dict[str, Any]:
    """New text per choice; the first delta of a ``prompt_logprobs`` request
    also carries them, in vLLM's shape (``prompt_logprobs_body``)."""
    event = {"type": EventType.DELTA.value, "seq": seq, "choices": choices}
    if prompt_logprobs is not None:
        event["prompt_logprobs"] = prompt_logprobs
    return event


def usage_body(
    *, prompt_tokens: int = 0, completion_tokens: int = 0, cached_tokens: int = 0
) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "cached_tokens": cached_tokens,
    }


def metrics_body(
    *, queue_time_ms: float | None = None, ttft_ms: float | None = None, duration_ms: float = 0.0
) -> dict[str, float | None]:
    return {"queue_time_ms": queue_time_ms, "ttft_ms": ttft_ms, "duration_ms": duration_ms}


def terminal_event(
    type: EventType,
    seq: int,
    *,
    usage: dict[str, int] | None = None,
    metrics: dict[str, float | None] | None = None,
    finish_reasons: dict[str, str] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": EventType(type).value,
        "seq": seq,
        "usage": usage if usage is not None else usage_body(),
        "metrics": metrics if metrics is not None else metrics_body(),
        "finish_reasons": finish_reasons or {},
    }
    if type == EventType.FAILED:
        event["error"] = error or error_body("Internal error")
    return event


def usage_from_events(events: list[dict[str, Any]]) -> dict[str, int]:
    """Usage implied by a stream's events, for a terminal the web tier writes.

    Counts every choice's tokens, like the worker does (n > 1 sums).
    """
    prompt = completion = 0
    for event in events:
        if event["type"] == EventType.CREATED:
            prompt = event.get("prompt_tokens", 0)
        elif event["type"] == EventType.DELTA:
            completion += sum(len(c.get("token_ids") or []) for c in event["choices"])
    return usage_body(prompt_tokens=prompt, completion_tokens=completion)
