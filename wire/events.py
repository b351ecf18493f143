"""The events on a response stream, as typed records.

Stream contract (docs/architecture.md, "Stream contract"): every response
has one id; its events are ``Created``, then ``Delta`` events, then exactly
one ``Terminal`` (type ``completed``, ``incomplete``, ``failed`` or
``cancelled``). Every event carries ``seq``, rising by one from 1
(``Created``), so a client can resume after the last sequence number it saw.

The worker produces these and the web tier's relay consumes them; both
read and write the records, never their JSON: ``wire.codec`` is the one
place that encodes and decodes them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar


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


@dataclass(slots=True, frozen=True)
class ErrorInfo:
    """An OpenAI-shaped error, as a ``failed`` ending carries it."""

    message: str
    type: str = "server_error"
    param: str | None = None
    code: str | None = None


@dataclass(slots=True, frozen=True)
class TokenUsage:
    """Tokens a response used: what it is billed for and reports."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Prompt tokens served from the prefix cache (never more than prompt_tokens).
    cached_tokens: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
        )


@dataclass(slots=True, frozen=True)
class Timings:
    """A response's timings in milliseconds, from its enqueue on the web tier."""

    queue_time_ms: float | None = None
    ttft_ms: float | None = None
    duration_ms: float = 0.0


@dataclass(slots=True, frozen=True)
class TopLogprob:
    """One alternative for a generated token."""

    token: str
    logprob: float
    # The token's raw bytes (a token may hold part of a UTF-8 character).
    bytes: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """A generated token's logprob and its most likely alternatives."""

    token: str
    logprob: float
    bytes: tuple[int, ...]
    top_logprobs: tuple[TopLogprob, ...] = ()


@dataclass(slots=True, frozen=True)
class PromptLogprob:
    """One candidate at a prompt position (vLLM's prompt_logprobs entry)."""

    token_id: int
    logprob: float
    # 1 for the most likely token; None: the prompt's own token, not among
    # the top alternatives.
    rank: int | None
    decoded_token: str


# Per prompt position: None for the first token (nothing predicts it), else
# the prompt's own token first, then the top alternatives.
PromptLogprobs = tuple[tuple[PromptLogprob, ...] | None, ...]


@dataclass(slots=True, frozen=True)
class ChoiceDelta:
    """New output of one choice in a ``Delta``."""

    index: int
    text: str = ""
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None
    # "stop" or "length" on the choice's last delta only.
    finish_reason: str | None = None


@dataclass(slots=True, frozen=True)
class Created:
    """The worker admitted the request (``seq`` 1)."""

    type: ClassVar[EventType] = EventType.CREATED

    response_id: str
    model: str
    worker_id: str
    prompt_tokens: int
    # Unix seconds.
    created: int = field(default_factory=lambda: int(time.time()))
    seq: int = 1


@dataclass(slots=True, frozen=True)
class Delta:
    """New text per choice."""

    type: ClassVar[EventType] = EventType.DELTA

    seq: int
    choices: tuple[ChoiceDelta, ...]
    # On the first delta of a request with prompt_logprobs only.
    prompt_logprobs: PromptLogprobs | None = None


@dataclass(slots=True, frozen=True)
class Terminal:
    """The one ending of a response."""

    type: EventType
    seq: int
    usage: TokenUsage = TokenUsage()
    metrics: Timings = Timings()
    # Choice index -> the engine's finish reason ("stop", "length", "abort").
    finish_reasons: dict[int, str] = field(default_factory=dict)
    # On ``failed`` only.
    error: ErrorInfo | None = None

    def __post_init__(self) -> None:
        if self.type not in TERMINAL_EVENTS:
            raise ValueError(f"{self.type!r} is not a terminal event type")
        if self.type == EventType.FAILED and self.error is None:
            object.__setattr__(self, "error", ErrorInfo("Internal error"))

    @property
    def finish_reason(self) -> str | None:
        """The first choice's finish reason, if the ending names one."""
        return self.finish_reasons.get(0)


Event = Created | Delta | Terminal


def worker_lost_error() -> ErrorInfo:
    return ErrorInfo(WORKER_LOST_MESSAGE, code="worker_lost")


def retries_spent_error(deliveries: int) -> ErrorInfo:
    """A request whose workers died before it started, ``deliveries`` times."""
    message = (
        f"{WORKER_LOST_MESSAGE} before it started, {deliveries} times;"
        " it was not tried again (retry budget spent)"
    )
    return ErrorInfo(message, code="worker_lost")


def usage_of(events: list[Event]) -> TokenUsage:
    """Usage implied by a stream's events, for an ending the web tier writes.

    Counts every choice's tokens, like the worker does (n > 1 sums).
    """
    prompt = completion = 0
    for event in events:
        if isinstance(event, Created):
            prompt = event.prompt_tokens
        elif isinstance(event, Delta):
            completion += sum(len(c.token_ids) for c in event.choices)
    return TokenUsage(prompt_tokens=prompt, completion_tokens=completion)
