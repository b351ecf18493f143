"""The web validates against sampling_rules.limits; the engine accepts exactly that much."""

import pytest

from gpuworkers.engine.sampling_params import InvalidSamplingParams, SamplingParams
from sampling_rules.limits import (
    LOGIT_BIAS_RANGE,
    MAX_BAD_WORD_CHARS,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS,
    MAX_N,
    MAX_PROMPT_LOGPROBS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOP_LOGPROBS,
)


def test_the_engine_accepts_every_request_at_the_wire_limits():
    params = SamplingParams(
        n=MAX_N, stop=["s"] * MAX_STOP_STRINGS, logprobs=True, top_logprobs=MAX_TOP_LOGPROBS
    )
    assert (params.n, len(params.stop), params.top_logprobs) == (
        MAX_N,
        MAX_STOP_STRINGS,
        MAX_TOP_LOGPROBS,
    )


def test_the_engine_accepts_the_vllm_extras_at_the_wire_limits():
    params = SamplingParams(
        logit_bias={str(i): LOGIT_BIAS_RANGE for i in range(MAX_LOGIT_BIAS)},
        bad_words=["w" * MAX_BAD_WORD_CHARS] * MAX_BAD_WORDS,
        stop_token_ids=list(range(MAX_STOP_TOKEN_IDS)),
        prompt_logprobs=MAX_PROMPT_LOGPROBS,
        presence_penalty=-2.0,
        frequency_penalty=2.0,
    )
    assert len(params.logit_bias) == MAX_LOGIT_BIAS and params.logit_bias[0] == LOGIT_BIAS_RANGE
    assert (len(params.bad_words), params.prompt_logprobs) == (MAX_BAD_WORDS, MAX_PROMPT_LOGPROBS)


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("n", {"n": MAX_N + 1}),
        ("stop", {"stop": ["s"] * (MAX_STOP_STRINGS + 1)}),
        ("top_logprobs", {"logprobs": True, "top_logprobs": MAX_TOP_LOGPROBS + 1}),
    ],
)
def test_the_engine_refuses_one_past_each_wire_limit(field, kwargs):
    with pytest.raises(InvalidSamplingParams) as caught:
        SamplingParams(**kwargs)
    assert caught.value.param == field
