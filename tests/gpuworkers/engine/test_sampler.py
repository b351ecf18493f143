"""Sampling: greedy, truncation, and seeds that ignore batch composition."""

import pytest
import torch

from gpuworkers.engine.sampler import SampleRequest, make_generator, sample
from gpuworkers.engine.sampling_params import InvalidSamplingParams, SamplingParams


def logits_rows(n, vocab=50, seed=0):
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed))


def test_greedy_takes_the_argmax():
    logits = logits_rows(3)
    params = SamplingParams(temperature=0.0)
    results = sample(logits, [SampleRequest(i, params, None) for i in range(3)])
    assert [r.token_id for r in results] == logits.argmax(-1).tolist()


def test_same_seed_same_sample_in_different_batches():
    target = logits_rows(1, seed=42)[0]
    params = SamplingParams(temperature=1.0, seed=1234)
    draws = []
    for batch_size, position in ((1, 0), (5, 3), (9, 7)):
        logits = logits_rows(batch_size, seed=batch_size)
        logits[position] = target
        requests = [
            SampleRequest(i, SamplingParams(temperature=1.0), make_generator(None, 0))
            for i in range(batch_size)
        ]
        requests[position] = SampleRequest(position, params, make_generator(1234, 0))
        tokens = []
        for _ in range(20):
            tokens.append(sample(logits, requests)[position].token_id)
        draws.append(tokens)
    assert draws[0] == draws[1] == draws[2]
    assert len(set(draws[0])) > 1, "the draws are random, not constant"


def test_top_k_one_is_greedy_and_top_p_truncates():
    logits = logits_rows(1)
    top1 = SamplingParams(temperature=1.0, top_k=1)
    for seed in range(5):
        result = sample(logits, [SampleRequest(0, top1, make_generator(seed, 0))])
        assert result[0].token_id == int(logits[0].argmax())
    probs = torch.softmax(logits[0], -1)
    order = probs.argsort(descending=True)
    nucleus = set(order[: int((probs[order].cumsum(0) < 0.5).sum()) + 1].tolist())
    top_p = SamplingParams(temperature=1.0, top_p=0.5)
    for seed in range(30):
        token = sample(logits, [SampleRequest(0, top_p, make_generator(seed, 0))])[0].token_id
        assert token in nucleus


def test_logprobs_and_top_logprobs():
    logits = logits_rows(1)
    params = SamplingParams(temperature=0.0, logprobs=True, top_logprobs=3)
    result = sample(logits, [SampleRequest(0, params, None)])[0]
    expected = torch.log_softmax(logits[0], -1)
    assert result.logprob == pytest.approx(float(expected.max()))
    assert [t for t, _ in result.top] == expected.topk(3).indices.tolist()


def test_invalid_params_name_the_field():
    with pytest.raises(InvalidSamplingParams) as error:
        SamplingParams(top_logprobs=21, logprobs=True)
    assert error.value.param == "top_logprobs"
    with pytest.raises(InvalidSamplingParams) as error:
        SamplingParams(max_tokens=0)
    assert error.value.param == "max_tokens"
