"""Bus events -> OpenAI ``chat.completion`` / ``chat.completion.chunk`` bodies.

Plain functions and small state machines with no I/O, shared by the SSE
relay, the non-streaming endpoint and stream resumes. They read the typed
events of ``wire.events`` and write OpenAI's JSON, the edge. A
``UsageLedger`` fed the same events always counts the same usage, which is
how the usage chunk, the non-streamed ``usage`` and the UsageRecord agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inference.tool_calls.records import ToolChoiceDelta
from wire.codec import error_json, logprob_json, prompt_logprobs_json
from wire.events import (
    ChoiceDelta,
    Created,
    Delta,
    ErrorInfo,
    Event,
    EventType,
    PromptLogprobs,
    Terminal,
    TokenLogprob,
    TokenUsage,
)

CANCELLED = ErrorInfo("The response was cancelled before it finished.", code="cancelled")


@dataclass(slots=True)
class UsageLedger:
    """Counts tokens as events pass, for endings that carry no usage.

    A ``failed`` ending made because the bus went away carries zeros; the
    tokens the client already received still count.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    last_seq: int = 0

    def add(self, event: Event) -> None:
        self.last_seq = max(self.last_seq, event.seq)
        if isinstance(event, Created):
            self.prompt_tokens = event.prompt_tokens
        elif isinstance(event, Delta):
            self.completion_tokens += sum(len(c.token_ids) for c in event.choices)

    def counted(self) -> TokenUsage:
        return TokenUsage(self.prompt_tokens, self.completion_tokens)

    def usage(self, terminal: Terminal) -> TokenUsage:
        """The ending's counts, or what was counted where it has none."""
        usage = terminal.usage
        prompt = usage.prompt_tokens or self.prompt_tokens
        return TokenUsage(
            prompt_tokens=prompt,
            completion_tokens=usage.completion_tokens or self.completion_tokens,
            cached_tokens=min(prompt, usage.cached_tokens),
        )


def usage_payload(usage: TokenUsage) -> dict[str, Any]:
    """OpenAI's ``usage`` object."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def token_logprobs(entries: tuple[TokenLogprob, ...] | None) -> list[dict[str, Any]]:
    """A delta's logprobs as OpenAI ``logprobs.content`` items."""
    return [logprob_json(entry) for entry in entries or ()]


def ending_error(terminal: Terminal) -> ErrorInfo:
    """What a client is told about an ending that is no success."""
    if terminal.type == EventType.CANCELLED:
        return CANCELLED
    return terminal.error or CANCELLED


def default_finish_reason(terminal: Terminal) -> str:
    return "content_filter" if terminal.type == EventType.INCOMPLETE else "stop"


def stream_chunk(
    stream: Any, kind: str, choices: list[dict[str, Any]], extra: dict[str, Any]
) -> dict[str, Any]:
    """One streamed body of ``kind`` for ``stream`` (its id, created, model
    and service tier); ``usage: null`` on every chunk but the last when the
    client asked for the usage chunk, as OpenAI sends it."""
    chunk = {
        "id": stream.response_id,
        "object": kind,
        "created": stream.created,
        "model": stream.model,
        "service_tier": stream.service_tier,
        "choices": choices,
    }
    if stream.include_usage:
        chunk["usage"] = None
    chunk.update(extra)
    return chunk


@dataclass(slots=True)
class ChunkStream:
    """Maps one response's events to ``chat.completion.chunk`` bodies.

    Each delta becomes one chunk with every choice that has something to
    say, and the terminal event the missing finish_reasons, the usage chunk
    and (on failure) an error. A choice's finish_reason is sent exactly
    once, on its last chunk.

    The role chunk goes out just before the first content (or the ending),
    not at ``created``: clients time the first token by the first chunk
    (vLLM's ``bench serve`` and OpenAI's own stream both put it there), so a
    role chunk sent at admission would report queueing, not prefill, as
    time to first token. The stream is not silent meanwhile: SSE
    keep-alive comments run from the start (``inference.api.sse``).
    """

    response_id: str
    model: str
    created: int
    n: int
    include_usage: bool
    # The service tier actually used (inference.service_tier), on every chunk.
    service_tier: str = "default"
    ledger: UsageLedger = field(default_factory=UsageLedger)
    finished: set[int] = field(default_factory=set)
    role_sent: bool = False

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return stream_chunk(self, "chat.completion.chunk", choices, extra)

    def _with_role(self, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.role_sent or not payloads:
            return payloads
        self.role_sent = True
        role = {"role": "assistant", "content": ""}
        return [self._chunk([_choice(i, role) for i in range(self.n)]), *payloads]

    def payloads(self, event: Event) -> list[dict[str, Any]]:
        """The bodies for one event; ``{"error": ...}`` for a failed ending."""
        self.ledger.add(event)
        if isinstance(event, Delta):
            choices = []
            for c in event.choices:
                calls = c.tool_calls if isinstance(c, ToolChoiceDelta) else ()
                if not (c.text or c.logprobs or c.finish_reason or calls):
                    continue
                logprobs = (
                    {"content": token_logprobs(c.logprobs), "refusal": None} if c.logprobs else None
                )
                delta: dict[str, Any] = {"content": c.text}
                if calls:
                    # inference.tool_calls: call deltas, content only if any.
                    delta = {"content": c.text} if c.text else {}
                    delta["tool_calls"] = [call.payload() for call in calls]
                choices.append(_choice(c.index, delta, logprobs, c.finish_reason))
                if c.finish_reason:
                    self.finished.add(c.index)
            return self._with_role([self._chunk(choices)] if choices else [])
        if not isinstance(event, Terminal):
            return []
        return self._terminal_payloads(event)

    def _terminal_payloads(self, event: Terminal) -> list[dict[str, Any]]:
        if event.type in (EventType.FAILED, EventType.CANCELLED):
            return [{"error": error_json(ending_error(event))}]
        payloads = []
        default = default_finish_reason(event)
        pending = [i for i in range(self.n) if i not in self.finished]
        if pending:
            reasons = event.finish_reasons
            choices = [_choice(i, {}, None, reasons.get(i) or default) for i in pending]
            payloads.append(self._chunk(choices))
            self.finished.update(pending)
        if self.include_usage:
            payloads.append(self._chunk([], usage=usage_payload(self.ledger.usage(event))))
        # An ending with no content before it still says the role first.
        return self._with_role(payloads)


def _choice(
    index: int,
    delta: dict[str, Any],
    logprobs: dict[str, Any] | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


@dataclass(slots=True)
class CompletionBuilder:
    """Collects one response's events into a ``chat.completion`` body."""

    response_id: str
    model: str
    created: int
    n: int
    logprobs: bool
    # The service tier actually used (inference.service_tier).
    service_tier: str = "default"
    ledger: UsageLedger = field(default_factory=UsageLedger)
    texts: dict[int, list[str]] = field(default_factory=dict)
    token_logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    finish_reasons: dict[int, str] = field(default_factory=dict)
    # vLLM's extra: per prompt token, its logprob and alternatives.
    prompt_logprobs: PromptLogprobs | None = None

    def add(self, event: Event) -> None:
        self.ledger.add(event)
        if not isinstance(event, Delta):
            return
        if event.prompt_logprobs is not None:
            self.prompt_logprobs = event.prompt_logprobs
        for c in event.choices:
            self.add_choice(c)

    def add_choice(self, c: ChoiceDelta) -> None:
        self.texts.setdefault(c.index, []).append(c.text)
        if c.logprobs:
            self.token_logprobs.setdefault(c.index, []).extend(c.logprobs)
        if c.finish_reason:
            self.finish_reasons[c.index] = c.finish_reason

    def text(self, index: int = 0) -> str:
        return "".join(self.texts.get(index, ()))

    def finish_reason(self, terminal: Terminal, index: int = 0) -> str:
        return (
            self.finish_reasons.get(index)
            or terminal.finish_reasons.get(index)
            or default_finish_reason(terminal)
        )

    def result(self, terminal: Terminal) -> dict[str, Any]:
        choices = []
        for i in range(self.n):
            logprobs = None
            if self.logprobs:
                content = [logprob_json(e) for e in self.token_logprobs.get(i, ())]
                logprobs = {"content": content, "refusal": None}
            choices.append(
                {
                    "index": i,
                    "message": {"role": "assistant", "content": self.text(i), "refusal": None},
                    "logprobs": logprobs,
                    "finish_reason": self.finish_reason(terminal, i),
                }
            )
        result = {
            "id": self.response_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage_payload(self.ledger.usage(terminal)),
            "service_tier": self.service_tier,
        }
        if self.prompt_logprobs is not None:
            result["prompt_logprobs"] = prompt_logprobs_json(self.prompt_logprobs)
        return result
