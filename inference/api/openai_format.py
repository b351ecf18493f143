"""Bus events -> OpenAI ``chat.completion`` / ``chat.completion.chunk`` dicts.

Plain functions and small state machines with no I/O, shared by the SSE
relay, the non-streaming endpoint and stream resumes. A ``UsageLedger``
fed the same events always computes the same usage, which is how the usage
chunk, the non-streamed ``usage`` and the UsageRecord agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wire.events import TERMINAL_EVENTS, EventType

# UsageRecord.finish_reason when the terminal event names none.
_STATUS_FINISH_REASON = {
    EventType.FAILED: "error",
    EventType.CANCELLED: "abort",
    EventType.INCOMPLETE: "content_filter",
    EventType.COMPLETED: "stop",
}


def _ms(value: float | None) -> int | None:
    return None if value is None else max(0, round(value))


@dataclass(slots=True)
class UsageSummary:
    """What one response consumed, as recorded and as reported to the client."""

    status: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_time_ms: int
    ttft_ms: int | None
    duration_ms: int

    def payload(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


@dataclass(slots=True)
class UsageLedger:
    """Counts tokens as events pass, for terminals that carry no usage.

    A ``failed`` event synthesized because the bus went away carries zeros;
    the tokens the client already received still count.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    last_seq: int = 0

    def add(self, event: dict[str, Any]) -> None:
        self.last_seq = max(self.last_seq, int(event.get("seq", 0)))
        if event["type"] == EventType.CREATED:
            self.prompt_tokens = int(event.get("prompt_tokens") or 0)
        elif event["type"] == EventType.DELTA:
            self.completion_tokens += sum(len(c.get("token_ids") or ()) for c in event["choices"])

    def summary(self, terminal: dict[str, Any]) -> UsageSummary:
        usage = terminal.get("usage") or {}
        metrics = terminal.get("metrics") or {}
        prompt = int(usage.get("prompt_tokens") or self.prompt_tokens)
        status = EventType(terminal["type"])
        reasons = terminal.get("finish_reasons") or {}
        return UsageSummary(
            status=status.value,
            finish_reason=reasons.get("0") or _STATUS_FINISH_REASON[status],
            prompt_tokens=prompt,
            cached_tokens=min(prompt, int(usage.get("cached_tokens") or 0)),
            completion_tokens=int(usage.get("completion_tokens") or self.completion_tokens),
            queue_time_ms=_ms(metrics.get("queue_time_ms")) or 0,
            ttft_ms=_ms(metrics.get("ttft_ms")),
            duration_ms=_ms(metrics.get("duration_ms")) or 0,
        )


def token_logprobs(entries: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A delta's logprobs as OpenAI ``logprobs.content`` items.

    Workers send them in that shape already; engine-style records
    (token, logprob, top as ``[token_id, token, logprob]``) are converted.
    """

    def item(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    content = []
    for entry in entries or ():
        if "top_logprobs" in entry:
            content.append(entry)
            continue
        top = [item(alt[1], alt[2]) for alt in entry.get("top") or ()]
        content.append({**item(entry["token"], entry["logprob"]), "top_logprobs": top})
    return content


def cancelled_error() -> dict[str, Any]:
    return {
        "message": "The response was cancelled before it finished.",
        "type": "server_error",
        "param": None,
        "code": "cancelled",
    }


def stream_chunk(
    stream: Any, kind: str, choices: list[dict[str, Any]], extra: dict[str, Any]
) -> dict[str, Any]:
    """One streamed payload of ``kind`` for ``stream`` (its id, created and
    model); ``usage: null`` on every chunk but the last when the client
    asked for the usage chunk, as OpenAI sends it."""
    chunk = {
        "id": stream.response_id,
        "object": kind,
        "created": stream.created,
        "model": stream.model,
        "choices": choices,
    }
    if stream.include_usage:
        chunk["usage"] = None
    chunk.update(extra)
    return chunk


@dataclass(slots=True)
class ChunkStream:
    """Maps one response's events to ``chat.completion.chunk`` payloads.

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

    def payloads(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """The payloads for one event; ``{"error": ...}`` for a failed ending."""
        self.ledger.add(event)
        kind = event["type"]
        if kind == EventType.DELTA:
            choices = []
            for c in event["choices"]:
                reason = c.get("finish_reason")
                calls = c.get("tool_calls")
                if not (c.get("text") or c.get("logprobs") or reason or calls):
                    continue
                logprobs = (
                    {"content": token_logprobs(c["logprobs"]), "refusal": None}
                    if c.get("logprobs")
                    else None
                )
                delta: dict[str, Any] = {"content": c.get("text") or ""}
                if calls:
                    # inference.tool_calls: call deltas, content only if any.
                    delta = {"content": c["text"]} if c.get("text") else {}
                    delta["tool_calls"] = calls
                choices.append(_choice(c["index"], delta, logprobs, reason))
                if reason:
                    self.finished.add(c["index"])
            return self._with_role([self._chunk(choices)] if choices else [])
        if kind not in TERMINAL_EVENTS:
            return []
        return self._terminal_payloads(event)

    def _terminal_payloads(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event["type"]
        if kind == EventType.FAILED:
            return [{"error": event.get("error") or cancelled_error()}]
        if kind == EventType.CANCELLED:
            return [{"error": cancelled_error()}]
        payloads = []
        reasons = event.get("finish_reasons") or {}
        default = "content_filter" if kind == EventType.INCOMPLETE else "stop"
        pending = [i for i in range(self.n) if i not in self.finished]
        if pending:
            choices = [_choice(i, {}, None, reasons.get(str(i)) or default) for i in pending]
            payloads.append(self._chunk(choices))
            self.finished.update(pending)
        if self.include_usage:
            usage = self.ledger.summary(event).payload()
            payloads.append(self._chunk([], usage=usage))
        # An ending with no content before it still says the role first.
        return self._with_role(payloads)


def _choice(
    index: int,
    delta: dict[str, Any],
    logprobs: dict | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


@dataclass(slots=True)
class CompletionBuilder:
    """Collects one response's events into a ``chat.completion`` payload."""

    response_id: str
    model: str
    created: int
    n: int
    logprobs: bool
    ledger: UsageLedger = field(default_factory=UsageLedger)
    texts: dict[int, list[str]] = field(default_factory=dict)
    token_logprobs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    finish_reasons: dict[int, str] = field(default_factory=dict)
    # vLLM's extra: per prompt token, its logprob and alternatives.
    prompt_logprobs: list | None = None

    def add(self, event: dict[str, Any]) -> None:
        self.ledger.add(event)
        if event["type"] != EventType.DELTA:
            return
        if "prompt_logprobs" in event:
            self.prompt_logprobs = event["prompt_logprobs"]
        for c in event["choices"]:
            index = c["index"]
            self.texts.setdefault(index, []).append(c.get("text") or "")
            if c.get("logprobs"):
                self.token_logprobs.setdefault(index, []).extend(token_logprobs(c["logprobs"]))
            if c.get("finish_reason"):
                self.finish_reasons[index] = c["finish_reason"]

    def result(self, terminal: dict[str, Any]) -> dict[str, Any]:
        reasons = terminal.get("finish_reasons") or {}
        default = "content_filter" if terminal["type"] == EventType.INCOMPLETE else "stop"
        choices = []
        for i in range(self.n):
            choices.append(
                {
                    "index": i,
                    "message": {
                        "role": "assistant",
                        "content": "".join(self.texts.get(i, ())),
                        "refusal": None,
                    },
                    "logprobs": {"content": self.token_logprobs.get(i, []), "refusal": None}
                    if self.logprobs
                    else None,
                    "finish_reason": self.finish_reasons.get(i) or reasons.get(str(i)) or default,
                }
            )
        result = {
            "id": self.response_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.ledger.summary(terminal).payload(),
        }
        if self.prompt_logprobs is not None:
            result["prompt_logprobs"] = self.prompt_logprobs
        return result
