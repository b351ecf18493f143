"""One set of limits, read by both sides: the web tier's Sampling and the
engine's SamplingParams accept and refuse exactly the same settings."""

from __future__ import annotations

import dataclasses

import pytest

from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.sampling import sampling_params
from sampling_rules import InvalidSamplingParams, TokenIdOutOfVocabulary
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
from wire.sampling import Sampling

VOCAB = 49152
AT_THE_LIMITS = Sampling(
    max_tokens=16,
    temperature=MAX_TEMPERATURE,
    n=MAX_N,
    stop=("s" * MAX_STOP_STRING_CHARS,) * MAX_STOP_STRINGS,
    logprobs=True,
    top_logprobs=MAX_TOP_LOGPROBS,
    logit_bias={i: LOGIT_BIAS_RANGE for i in range(MAX_LOGIT_BIAS)},
    bad_words=("w" * MAX_BAD_WORD_CHARS,) * MAX_BAD_WORDS,
    stop_token_ids=tuple(range(MAX_STOP_TOKEN_IDS)),
    prompt_logprobs=MAX_PROMPT_LOGPROBS,
    presence_penalty=-PENALTY_RANGE,
    frequency_penalty=PENALTY_RANGE,
    repetition_penalty=MAX_REPETITION_PENALTY,
)
ONE_PAST = {
    "n": {"n": MAX_N + 1},
    "temperature": {"temperature": MAX_TEMPERATURE + 0.01},
    "stop": {"stop": ("s",) * (MAX_STOP_STRINGS + 1)},
    "top_logprobs": {"top_logprobs": MAX_TOP_LOGPROBS + 1},
    "logit_bias": {"logit_bias": {i: 1.0 for i in range(MAX_LOGIT_BIAS + 1)}},
    "bad_words": {"bad_words": ("w",) * (MAX_BAD_WORDS + 1)},
    "stop_token_ids": {"stop_token_ids": tuple(range(MAX_STOP_TOKEN_IDS + 1))},
    "prompt_logprobs": {"prompt_logprobs": MAX_PROMPT_LOGPROBS + 1},
    "presence_penalty": {"presence_penalty": PENALTY_RANGE + 0.5},
    "repetition_penalty": {"repetition_penalty": MAX_REPETITION_PENALTY + 0.5},
}


def test_both_sides_accept_a_request_at_every_limit():
    assert AT_THE_LIMITS.checked(vocab_size=VOCAB) == AT_THE_LIMITS
    params = sampling_params(AT_THE_LIMITS)
    assert (params.n, len(params.stop), len(params.bad_words)) == (
        MAX_N,
        MAX_STOP_STRINGS,
        MAX_BAD_WORDS,
    )
    assert len(params.logit_bias) == MAX_LOGIT_BIAS and params.logit_bias[0] == LOGIT_BIAS_RANGE


@pytest.mark.parametrize("field", sorted(ONE_PAST))
def test_both_sides_refuse_one_past_each_limit_naming_the_field(field):
    past = dataclasses.replace(AT_THE_LIMITS, **ONE_PAST[field])
    with pytest.raises(InvalidSamplingParams) as web:
        past.checked(vocab_size=VOCAB)
    with pytest.raises(InvalidSamplingParams) as engine:
        sampling_params(past)
    assert web.value.param == engine.value.param == field
    assert str(web.value) == str(engine.value)


def test_token_ids_outside_the_vocabulary_are_refused_as_such():
    with pytest.raises(TokenIdOutOfVocabulary) as caught:
        Sampling(max_tokens=1, stop_token_ids=(VOCAB,)).checked(vocab_size=VOCAB)
    assert caught.value.param == "stop_token_ids"
    assert "vocabulary has 49152 tokens" in str(caught.value)


def test_the_wire_record_and_the_engines_have_the_same_fields():
    """gpuworkers.sampling maps field by field: neither side may grow one alone."""
    wire_fields = {f.name for f in dataclasses.fields(Sampling)}
    engine_fields = {f.name for f in dataclasses.fields(SamplingParams)}
    assert wire_fields == engine_fields


def test_the_structured_output_is_normalized_once_on_each_side():
    spec = {"type": "json_schema", "schema": {"type": "object"}}
    checked = Sampling(max_tokens=4, structured_output=spec).checked(vocab_size=VOCAB)
    assert checked.structured_output == {**spec, "strict": False}
    assert sampling_params(checked).structured_output == checked.structured_output
