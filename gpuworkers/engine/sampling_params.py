"""Per-request sampling settings, validated once on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 4
MAX_N = 8


class InvalidSamplingParams(ValueError):
    """A sampling setting out of range; ``param`` names the offending field."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(slots=True)
class SamplingParams:
    """How to sample one request.

    temperature 0 means greedy. ``seed`` makes sampling reproducible for this
    request alone: each request draws from its own generator, so the same
    seed gives the same tokens whatever else shares the batch.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    n: int = 1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidSamplingParams("max_tokens", "max_tokens must be an integer >= 1")
        if not 0.0 <= self.temperature <= 2.0:
            raise InvalidSamplingParams("temperature", "temperature must be between 0 and 2")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidSamplingParams("top_p", "top_p must be in (0, 1]")
        if self.top_k < 0:
            raise InvalidSamplingParams("top_k", "top_k must be >= 0 (0 disables it)")
        if not 1 <= self.n <= MAX_N:
            raise InvalidSamplingParams("n", f"n must be between 1 and {MAX_N}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidSamplingParams("stop", f"at most {MAX_STOP_STRINGS} stop sequences")
        if any(not s for s in self.stop):
            raise InvalidSamplingParams("stop", "stop sequences must be non-empty strings")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidSamplingParams(
                "top_logprobs", f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}"
            )
        if self.top_logprobs and not self.logprobs:
            raise InvalidSamplingParams("top_logprobs", "top_logprobs requires logprobs=true")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
