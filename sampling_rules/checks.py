"""The checks every sampling record passes: the web tier's before it enqueues
a request (``wire.sampling.Sampling``), the engine's when it builds
``SamplingParams``. Both run these same functions over the same limits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sampling_rules.errors import InvalidSamplingParams, TokenIdOutOfVocabulary
from sampling_rules.limits import (
    LOGIT_BIAS_RANGE,
    MAX_BAD_WORD_CHARS,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS,
    MAX_N,
    MAX_PROMPT_LOGPROBS,
    MAX_REPETITION_PENALTY,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TEMPERATURE,
    MAX_TOP_LOGPROBS,
    PENALTY_RANGE,
)


class SamplingFields(Protocol):
    """The fields both sampling records have (wire's and the engine's)."""

    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    n: int
    stop: Sequence[str]
    stop_token_ids: Sequence[int]
    min_tokens: int
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: Mapping[int, float]
    bad_words: Sequence[str]
    logprobs: bool
    top_logprobs: int
    prompt_logprobs: int | None
    structured_output: dict[str, Any] | None


def sampling_check(fields: SamplingFields) -> dict[str, Any] | None:
    """Raise InvalidSamplingParams for the first rule ``fields`` breaks.

    Returns the structured-output spec normalized (defaults filled in, its
    grammar validated: ``sampling_rules.structured``), or None.
    """
    _check_ranges(fields)
    _check_lists(fields)
    if not 0 <= fields.top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidSamplingParams(
            "top_logprobs", f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}"
        )
    if fields.top_logprobs and not fields.logprobs:
        raise InvalidSamplingParams("top_logprobs", "top_logprobs requires logprobs=true")
    prompt_logprobs = fields.prompt_logprobs
    if prompt_logprobs is not None and not 0 <= prompt_logprobs <= MAX_PROMPT_LOGPROBS:
        raise InvalidSamplingParams(
            "prompt_logprobs", f"prompt_logprobs must be between 0 and {MAX_PROMPT_LOGPROBS}"
        )
    if fields.structured_output is None:
        return None
    # Imported here: the grammar compiler is loaded on first use only.
    from sampling_rules.structured import normalize

    return normalize(fields.structured_output)


def _check_ranges(f: SamplingFields) -> None:
    if not isinstance(f.max_tokens, int) or f.max_tokens < 1:
        raise InvalidSamplingParams("max_tokens", "max_tokens must be an integer >= 1")
    if not 0.0 <= f.temperature <= MAX_TEMPERATURE:
        raise InvalidSamplingParams(
            "temperature", f"temperature must be between 0 and {MAX_TEMPERATURE:g}"
        )
    if not 0.0 < f.top_p <= 1.0:
        raise InvalidSamplingParams("top_p", "top_p must be in (0, 1]")
    if f.top_k < 0:
        raise InvalidSamplingParams("top_k", "top_k must be >= 0 (0 or -1 disables it)")
    if not 0.0 <= f.min_p <= 1.0:
        raise InvalidSamplingParams("min_p", "min_p must be between 0 and 1")
    if not 1 <= f.n <= MAX_N:
        raise InvalidSamplingParams("n", f"n must be between 1 and {MAX_N}")
    if not isinstance(f.min_tokens, int) or not 0 <= f.min_tokens <= f.max_tokens:
        raise InvalidSamplingParams(
            "min_tokens", "min_tokens must be an integer between 0 and max_tokens"
        )
    for name in ("presence_penalty", "frequency_penalty"):
        if not -PENALTY_RANGE <= getattr(f, name) <= PENALTY_RANGE:
            raise InvalidSamplingParams(
                name, f"{name} must be between -{PENALTY_RANGE:g} and {PENALTY_RANGE:g}"
            )
    if not 0.0 < f.repetition_penalty <= MAX_REPETITION_PENALTY:
        raise InvalidSamplingParams(
            "repetition_penalty",
            f"repetition_penalty must be > 0 and at most {MAX_REPETITION_PENALTY:g}",
        )


def _check_lists(f: SamplingFields) -> None:
    if len(f.stop) > MAX_STOP_STRINGS:
        raise InvalidSamplingParams("stop", f"at most {MAX_STOP_STRINGS} stop sequences")
    if any(not isinstance(s, str) or not s for s in f.stop):
        raise InvalidSamplingParams("stop", "stop sequences must be non-empty strings")
    if any(len(s) > MAX_STOP_STRING_CHARS for s in f.stop):
        raise InvalidSamplingParams(
            "stop", f"stop sequences may be at most {MAX_STOP_STRING_CHARS} characters"
        )
    if len(f.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidSamplingParams(
            "stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids"
        )
    if any(not isinstance(t, int) or t < 0 for t in f.stop_token_ids):
        raise InvalidSamplingParams("stop_token_ids", "stop_token_ids must be token ids >= 0")
    if len(f.logit_bias) > MAX_LOGIT_BIAS:
        raise InvalidSamplingParams("logit_bias", f"at most {MAX_LOGIT_BIAS} logit_bias entries")
    if any(t < 0 for t in f.logit_bias):
        raise InvalidSamplingParams("logit_bias", "logit_bias keys must be token ids >= 0")
    if any(not -LOGIT_BIAS_RANGE <= b <= LOGIT_BIAS_RANGE for b in f.logit_bias.values()):
        raise InvalidSamplingParams(
            "logit_bias",
            f"logit_bias values must be between -{LOGIT_BIAS_RANGE:g} and {LOGIT_BIAS_RANGE:g}",
        )
    if len(f.bad_words) > MAX_BAD_WORDS:
        raise InvalidSamplingParams("bad_words", f"at most {MAX_BAD_WORDS} bad_words")
    if any(not isinstance(w, str) or not w.strip() for w in f.bad_words):
        raise InvalidSamplingParams("bad_words", "bad_words must be non-empty strings")
    if any(len(w) > MAX_BAD_WORD_CHARS for w in f.bad_words):
        raise InvalidSamplingParams(
            "bad_words", f"bad_words may be at most {MAX_BAD_WORD_CHARS} characters"
        )


def vocab_check(fields: SamplingFields, vocab_size: int) -> None:
    """Token ids in the settings must exist in the model (only a side that
    knows the model's vocabulary can tell)."""
    for name, ids in (("logit_bias", fields.logit_bias), ("stop_token_ids", fields.stop_token_ids)):
        outside = sorted(t for t in ids if t >= vocab_size)
        if outside:
            raise TokenIdOutOfVocabulary(
                name,
                f"{name} names token id {outside[0]}, but this model's vocabulary has "
                f"{vocab_size} tokens (ids 0 to {vocab_size - 1}).",
            )
