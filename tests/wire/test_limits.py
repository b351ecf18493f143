"""The web validates against wire.limits; the engine accepts exactly that much."""

import pytest

from gpuworkers.engine.sampling_params import InvalidSamplingParams, SamplingParams
from wire.limits import MAX_N, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS


def test_the_engine_accepts_every_request_at_the_wire_limits():
    params = SamplingParams(
        n=MAX_N, stop=["s"] * MAX_STOP_STRINGS, logprobs=True, top_logprobs=MAX_TOP_LOGPROBS
    )
    assert (params.n, len(params.stop), params.top_logprobs) == (
        MAX_N,
        MAX_STOP_STRINGS,
        MAX_TOP_LOGPROBS,
    )


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
