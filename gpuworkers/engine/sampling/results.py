"""What sampling hands back to the engine."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SampleResult:
    """One drawn token, or one prompt token with its log-probability."""

    token_id: int
    logprob: float | None = None
    # (token_id, logprob) of the most likely tokens, best first.
    top: list[tuple[int, float]] | None = None


@dataclass(slots=True)
class StepOutput:
    """What one ``ModelRunner.execute`` produced."""

    # One per ``batch.samples`` entry, in that order.
    sampled: list[SampleResult] = field(default_factory=list)
    # seq id -> the prompt tokens this step's chunk predicted (the token at
    # position p + 1 from the logits at p), in prompt order.
    prompt_logprobs: dict[int, list[SampleResult]] = field(default_factory=dict)
