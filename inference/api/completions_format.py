"""Bus events -> OpenAI ``text_completion`` payloads (``/v1/completions``).

Reads the merged stream of ``inference.relay.multitap.MultiTap`` (choices carry
their ``prompt_index``). Logprobs use the legacy shape: ``tokens``,
``token_logprobs``, ``top_logprobs`` (token -> logprob, the sampled token
included) and ``text_offset`` (characters from the start of the choice's
text, echo included). With ``echo`` a choice's first chunk starts with its
prompt, and with ``logprobs`` too the prompt's tokens are scored (the
first, which nothing predicts, has null logprobs, as with OpenAI).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inference.api.openai_format import (
    UsageLedger,
    default_finish_reason,
    ending_error,
    stream_chunk,
    usage_payload,
)
from wire.codec import error_json
from wire.events import Delta, Event, EventType, PromptLogprob, Terminal, TokenLogprob


@dataclass(slots=True, frozen=True)
class PromptEcho:
    text: str
    # Each prompt token as text (prompt logprobs name tokens in the
    # tokenizer's byte-level spelling, and the first not at all).
    tokens: list[str]
    # A vocabulary token's spelling -> its text, for the alternatives.
    to_text: Callable[[str], str]


@dataclass(slots=True)
class LegacyLogprobs:
    """Accumulates one choice's logprobs, keeping ``text_offset`` running."""

    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)
    offset: int = 0

    def add(self, token: str, logprob: float | None, top: dict[str, float] | None) -> None:
        self.tokens.append(token)
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.text_offset.append(self.offset)
        self.offset += len(token)

    def take(self) -> dict[str, Any]:
        """What was added since the last take, as a legacy logprobs object."""
        out = {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }
        self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset = [], [], [], []
        return out


def add_prompt_logprobs(
    acc: LegacyLogprobs,
    entries: tuple[tuple[PromptLogprob, ...] | None, ...] | None,
    echo: PromptEcho,
    top_n: int,
) -> None:
    """The prompt's tokens from its prompt logprobs (own token first)."""
    for position, entry in enumerate(entries or ()):
        token = echo.tokens[position]
        if entry is None:
            acc.add(token, None, None)
            continue
        own, alternatives = entry[0], entry[1:]
        top = {
            echo.to_text(c.decoded_token): c.logprob
            for c in alternatives
            if c.rank is not None and c.rank <= top_n
        }
        top[token] = own.logprob
        acc.add(token, own.logprob, top)


@dataclass(slots=True)
class CompletionFrames:
    """Maps merged events to ``text_completion`` chunks (one per event at most)."""

    response_id: str
    model: str
    created: int
    n: int
    echoes: list[PromptEcho | None]
    logprobs: int | None
    include_usage: bool
    # The service tier actually used (inference.service_tier), on every chunk.
    service_tier: str = "default"
    ledger: UsageLedger = field(default_factory=UsageLedger)
    started: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)
    acc: dict[int, LegacyLogprobs] = field(default_factory=dict)
    prompt_entries: dict[int, tuple[tuple[PromptLogprob, ...] | None, ...]] = field(
        default_factory=dict
    )

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return stream_chunk(self, "text_completion", choices, extra)

    def _prompt_index(self, index: int) -> int:
        # Choices are numbered prompt_index * n + j (n choices per prompt).
        return index // (self.n // len(self.echoes))

    def _choice(
        self, index: int, text: str, items: tuple[TokenLogprob, ...] | None, reason: str | None
    ) -> dict[str, Any]:
        prefix = ""
        acc = self.acc.setdefault(index, LegacyLogprobs())
        if index not in self.started:
            self.started.add(index)
            prompt_index = self._prompt_index(index)
            echo = self.echoes[prompt_index]
            if echo is not None:
                prefix = echo.text
                if self.logprobs is not None:
                    entries = self.prompt_entries.get(prompt_index)
                    add_prompt_logprobs(acc, entries, echo, self.logprobs)
                # Offsets of generated tokens count from the end of the echo.
                acc.offset = len(prefix)
        for item in items or ():
            top = {t.token: t.logprob for t in item.top_logprobs}
            top.setdefault(item.token, item.logprob)
            acc.add(item.token, item.logprob, top)
        logprobs = acc.take() if self.logprobs is not None else None
        if reason:
            self.finished.add(index)
        return {
            "index": index,
            "text": prefix + text,
            "logprobs": logprobs,
            "finish_reason": reason,
        }

    def payloads(self, event: Event) -> list[dict[str, Any]]:
        self.ledger.add(event)
        if isinstance(event, Delta):
            if event.prompt_logprobs is not None and event.choices:
                # A merged delta's choices all come from one prompt.
                prompt_index = self._prompt_index(event.choices[0].index)
                self.prompt_entries[prompt_index] = event.prompt_logprobs
            choices = []
            for c in event.choices:
                quiet = not (c.text or c.logprobs or c.finish_reason)
                echo_due = c.index not in self.started and self.echoes[self._prompt_index(c.index)]
                if quiet and not echo_due:
                    continue
                choices.append(self._choice(c.index, c.text, c.logprobs, c.finish_reason))
            return [self._chunk(choices)] if choices else []
        if not isinstance(event, Terminal):
            return []
        if event.type in (EventType.FAILED, EventType.CANCELLED):
            return [{"error": error_json(ending_error(event))}]
        default = default_finish_reason(event)
        payloads = []
        pending = [i for i in range(self.n) if i not in self.finished]
        if pending:
            reasons = event.finish_reasons
            choices = [self._choice(i, "", None, reasons.get(i) or default) for i in pending]
            payloads.append(self._chunk(choices))
        if self.include_usage:
            payloads.append(self._chunk([], usage=usage_payload(self.ledger.usage(event))))
        return payloads


def completion_result(
    frames: CompletionFrames, payloads: list[dict[str, Any]], terminal: Terminal
) -> dict[str, Any]:
    """The non-streamed ``text_completion``: the chunks' choices joined."""
    texts: dict[int, list[str]] = {i: [] for i in range(frames.n)}
    logprobs: dict[int, dict[str, list]] = {}
    reasons: dict[int, str | None] = {}
    for payload in payloads:
        for choice in payload.get("choices") or ():
            index = choice["index"]
            texts[index].append(choice["text"])
            if choice["finish_reason"]:
                reasons[index] = choice["finish_reason"]
            if choice["logprobs"] is not None:
                merged = logprobs.setdefault(index, {k: [] for k in choice["logprobs"]})
                for key, values in choice["logprobs"].items():
                    merged[key].extend(values)
    empty = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    choices = [
        {
            "index": i,
            "text": "".join(texts[i]),
            "logprobs": logprobs.get(i, empty) if frames.logprobs is not None else None,
            "finish_reason": reasons.get(i) or "stop",
        }
        for i in range(frames.n)
    ]
    return {
        "id": frames.response_id,
        "object": "text_completion",
        "created": frames.created,
        "model": frames.model,
        "choices": choices,
        "usage": usage_payload(frames.ledger.usage(terminal)),
        "service_tier": frames.service_tier,
    }
