"""What the engine hands back: per-step deltas and whole offline results."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TokenLogprob:
    """One sampled token's log-probability and the most likely alternatives."""

    token_id: int
    token: str
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)


@dataclass(slots=True)
class ChoiceDelta:
    """What one choice (of ``n``) produced in one engine step."""

    index: int
    token_ids: list[int]
    # Text safe to show now: complete UTF-8 and never past a stop string.
    text: str
    logprobs: list[TokenLogprob] | None
    # "stop", "length" or "abort" on the step the choice ends, else None.
    finish_reason: str | None = None


@dataclass(slots=True)
class RequestOutput:
    """One request's progress in one ``LLMEngine.step()``."""

    request_id: str
    choices: list[ChoiceDelta]
    finished: bool
    num_prompt_tokens: int
    # Prompt tokens served from the prefix cache instead of computed.
    num_cached_tokens: int
    # Seconds from add_request to first scheduled / to first token.
    queue_time: float | None = None
    first_token_time: float | None = None
    # With params.prompt_logprobs, once, on the output with the first token:
    # one entry per prompt token (None for the first, which nothing
    # predicts, and for tokens served from the prefix cache).
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # Speculative decoding so far, over all choices: draft tokens verified
    # and those accepted (engine/spec/).
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


@dataclass(slots=True)
class CompletionChoice:
    index: int
    token_ids: list[int]
    text: str
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None = None


@dataclass(slots=True)
class GenerateOutput:
    """A whole offline result; ``token_ids``/``text`` are those of choice 0."""

    request_id: str
    prompt_token_ids: list[int]
    choices: list[CompletionChoice]
    num_cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprob | None] | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def token_ids(self) -> list[int]:
        return self.choices[0].token_ids

    @property
    def text(self) -> str:
        return self.choices[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.choices[0].finish_reason
