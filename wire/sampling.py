"""How to sample one request, as the web tier sends it to a worker.

``Sampling`` has the fields of the engine's ``SamplingParams`` and is the
only form sampling settings take between the API schemas and the engine:
every surface (chat, completions, responses, the console) builds one, the
web tier checks it (``checked``) before anything is enqueued, and the worker
builds the engine's ``SamplingParams`` from it (``gpuworkers.sampling``).
Both sides check with the same rules and limits (``sampling_rules``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from sampling_rules import sampling_check, vocab_check


@dataclass(slots=True, frozen=True)
class Sampling:
    """One request's sampling settings (vLLM's meanings, OpenAI's defaults)."""

    # None only before the web tier bounds it by the context and the tier's
    # output cap (``inference.prompts``); a request on the wire has one.
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    seed: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # Token id -> bias added to its logit.
    logit_bias: dict[int, float] = field(default_factory=dict)
    bad_words: tuple[str, ...] = ()
    skip_special_tokens: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: int | None = None
    deterministic: bool = False
    # The grammar constraint, a JSON document the grammar compiler reads
    # (``sampling_rules.structured``); None: unconstrained.
    structured_output: dict[str, Any] | None = None

    def checked(self, *, vocab_size: int) -> Sampling:
        """These settings once they pass every rule the engine applies (its
        structured output normalized); raises InvalidSamplingParams naming
        the field that breaks one."""
        vocab_check(self, vocab_size)
        return replace(self, structured_output=sampling_check(self))
