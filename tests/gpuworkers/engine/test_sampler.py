"""Sampling: greedy, truncation, seeds that ignore batch composition, and
every parameter against a plain-torch reference on the same logits."""

import pytest
import torch

from gpuworkers.engine.sampling import choice_seed, sample
from gpuworkers.engine.sampling.rng import uniform
from gpuworkers.engine.sampling.sampler import greedy_tokens, probabilities, process_logits
from gpuworkers.engine.sampling.truncation import invert_cdf
from gpuworkers.engine.sampling_params import InvalidSamplingParams, SamplingParams
from gpuworkers.engine.scheduling.batch import SampleInput

VOCAB = 50


def logits_rows(n, vocab=VOCAB, seed=0, scale=1.0):
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def inputs(params, rows, seed=7, draw=0, **fields):
    return [SampleInput(r, r, params, choice_seed(seed, r), draw, **fields) for r in rows]


def normalised(probs):
    return probs / probs.sum(-1, keepdim=True)


# Greedy, seeds, logprobs ---------------------------------------------------


def test_greedy_takes_the_argmax():
    logits = logits_rows(3)
    results = sample(logits, inputs(SamplingParams(temperature=0.0), range(3)))
    assert [r.token_id for r in results] == logits.argmax(-1).tolist()


def test_same_seed_same_sample_in_different_batches():
    target = logits_rows(1, seed=42)[0]
    params = SamplingParams(temperature=1.0, seed=1234)
    draws = []
    for batch_size, position in ((1, 0), (5, 3), (9, 7), (64, 40)):
        logits = logits_rows(batch_size, seed=batch_size)
        logits[position] = target
        others = SamplingParams(temperature=0.7, top_p=0.9)
        tokens = []
        for draw in range(40):
            batch = [
                SampleInput(i, i, others, choice_seed(None, 0), draw) for i in range(batch_size)
            ]
            batch[position] = SampleInput(position, 0, params, choice_seed(1234, 0), draw)
            tokens.append(sample(logits, batch)[position].token_id)
        draws.append(tokens)
    assert draws[0] == draws[1] == draws[2] == draws[3]
    assert len(set(draws[0])) > 5, "the draws are random, not constant"


def test_the_draw_is_the_inverse_cdf_at_the_rows_own_uniform():
    """The promise in sampler.py, literally: token = F^-1(uniform(seed, k))."""
    logits = logits_rows(4)
    params = SamplingParams(temperature=0.8, top_k=20)
    batch = inputs(params, range(4), draw=11)
    tokens = [r.token_id for r in sample(logits, batch)]
    u = uniform(torch.tensor([s.seed for s in batch]), torch.tensor([11] * 4))
    probs = probabilities(logits, batch)
    assert tokens == invert_cdf(probs, u).tolist()
    cdf = normalised(probs.double()).cumsum(-1)
    for row, token in enumerate(tokens):
        below = cdf[row, token - 1] if token else 0.0
        assert below <= u[row] < cdf[row, token]


def test_n_choices_sharing_a_row_draw_independently():
    logits = logits_rows(1, scale=0.1)  # nearly flat: choices rarely agree
    params = SamplingParams(temperature=1.0, seed=5)
    batch = [SampleInput(0, i, params, choice_seed(5, i), 0) for i in range(8)]
    assert len({r.token_id for r in sample(logits, batch)}) > 4


def test_logprobs_and_top_logprobs_are_the_models_distribution():
    logits = logits_rows(2)
    params = SamplingParams(temperature=1.5, top_k=3, logprobs=True, top_logprobs=3)
    results = sample(logits, inputs(params, range(2)))
    expected = torch.log_softmax(logits, -1)
    for row, result in enumerate(results):
        assert result.logprob == pytest.approx(float(expected[row, result.token_id]))
        assert [t for t, _ in result.top] == expected[row].topk(3).indices.tolist()


def test_invalid_params_name_the_field():
    cases = [
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -2.1}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_tokens": 17, "max_tokens": 16}, "min_tokens"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"bad_words": [" "]}, "bad_words"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ]
    for kwargs, field in cases:
        with pytest.raises(InvalidSamplingParams) as error:
            SamplingParams(**kwargs)
        assert error.value.param == field, kwargs
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(logit_bias={"198": -100}).logit_bias == {198: -100.0}
    with pytest.raises(InvalidSamplingParams) as error:
        SamplingParams(logit_bias={VOCAB: 1.0}).check_vocab(VOCAB)
    assert error.value.param == "logit_bias"


# Each parameter against plain torch ---------------------------------------


def test_logit_bias_is_added_to_the_logits():
    logits = logits_rows(2)
    bias = {3: 5.0, 17: -100.0, 40: 0.25}
    batch = [
        SampleInput(0, 0, SamplingParams(logit_bias=bias), 1, 0),
        SampleInput(1, 1, SamplingParams(), 2, 0),
    ]
    reference = logits.clone()
    for token, value in bias.items():
        reference[0, token] += value
    assert torch.equal(process_logits(logits, batch), reference)


def test_min_tokens_masks_stop_ids_until_reached():
    logits = logits_rows(1)
    params = SamplingParams(min_tokens=3, max_tokens=10)
    early = [SampleInput(0, 0, params, 1, 2, min_tokens_ids=(4, 9))]
    reference = logits.clone()
    reference[0, [4, 9]] = float("-inf")
    assert torch.equal(process_logits(logits, early), reference)
    reached = [SampleInput(0, 0, params, 1, 3, min_tokens_ids=(4, 9))]
    assert torch.equal(process_logits(logits, reached), logits)


def test_bad_words_mask_the_last_token_after_a_matching_prefix():
    logits = logits_rows(1)
    words = ((7,), (11, 12, 13), (20, 21))
    prompt = [20, 11, 12]  # a prefix ending the prompt does not count

    def masked(output):
        sample_input = SampleInput(
            0, 0, SamplingParams(), 1, len(output), prompt + output, len(prompt), (), words
        )
        scores = process_logits(logits, [sample_input])[0]
        return sorted(torch.nonzero(scores == float("-inf")).flatten().tolist())

    assert masked([]) == [7]
    assert masked([5, 11, 12]) == [7, 13]
    assert masked([20]) == [7, 21]
    assert masked([11, 12, 5]) == [7]


def test_penalties_match_a_plain_reference():
    logits = logits_rows(2, scale=3.0)
    prompt, output = [1, 2, 3, 3], [3, 5, 5, 5, 8]
    params = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.7)
    batch = [
        SampleInput(0, 0, params, 1, 5, prompt + output, len(prompt)),
        SampleInput(1, 1, SamplingParams(), 2, 0),  # untouched
    ]
    reference = logits.clone()
    row = reference[0]
    for token in set(prompt + output):
        row[token] = row[token] / 1.3 if row[token] > 0 else row[token] * 1.3
    for token in set(output):
        row[token] = row[token] - 0.4 * output.count(token)
        row[token] = row[token] - 0.7
    torch.testing.assert_close(process_logits(logits, batch), reference, rtol=0, atol=1e-6)


def test_greedy_applies_penalties_before_the_argmax():
    logits = torch.zeros(1, VOCAB)
    logits[0, 4], logits[0, 6] = 3.0, 2.5
    params = SamplingParams(temperature=0.0, frequency_penalty=1.0)
    batch = [SampleInput(0, 0, params, 1, 1, [1, 4], 1)]
    assert sample(logits, batch)[0].token_id == 6


def test_temperature_divides_the_logits():
    logits = logits_rows(3)
    batch = inputs(SamplingParams(temperature=0.6), range(3))
    torch.testing.assert_close(probabilities(logits, batch), torch.softmax(logits / 0.6, -1))


def reference_truncation(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """vLLM's order on one row: min-p and top-k, renormalise, then top-p."""
    probs = torch.softmax(logits / temperature, -1)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if top_k:
        keep &= probs >= probs.topk(top_k).values[-1]
    if min_p:
        keep &= probs >= min_p * probs.max()
    probs = torch.where(keep, probs, 0.0)
    probs = probs / probs.sum()
    if top_p < 1.0:
        values, order = probs.sort(descending=True)
        before = values.cumsum(0) - values
        nucleus = order[before < top_p]
        kept = torch.zeros_like(probs)
        kept[nucleus] = probs[nucleus]
        probs = kept / kept.sum()
    return probs


@pytest.mark.parametrize(
    "settings",
    [
        {"top_k": 5},
        {"top_p": 0.5},
        {"min_p": 0.2},
        {"temperature": 0.7, "top_k": 12, "top_p": 0.8, "min_p": 0.05},
        {"temperature": 1.3, "top_p": 0.95},
    ],
)
def test_truncation_matches_a_plain_reference(settings):
    logits = logits_rows(4, vocab=300, scale=2.0)
    batch = inputs(SamplingParams(**settings), range(4))
    got = normalised(probabilities(logits, batch))
    for row in range(4):
        torch.testing.assert_close(got[row], reference_truncation(logits[row], **settings))


def test_top_p_climbs_past_the_first_candidates_when_the_nucleus_is_wide():
    """A flat row's nucleus holds thousands of tokens: more than the first
    256 candidates the cut is looked for among."""
    logits = logits_rows(2, vocab=20000, scale=0.05)
    batch = inputs(SamplingParams(top_p=0.9), range(2))
    got = normalised(probabilities(logits, batch))
    for row in range(2):
        expected = reference_truncation(logits[row], top_p=0.9)
        assert int((expected > 0).sum()) > 4096
        torch.testing.assert_close(got[row], expected)


@pytest.mark.parametrize("settings", [{"top_k": 4}, {"top_p": 0.3}, {"min_p": 0.3}])
def test_truncated_draws_never_leave_the_kept_set(settings):
    logits = logits_rows(8, vocab=200, scale=2.0)
    allowed = [
        set(torch.nonzero(reference_truncation(row, **settings)).flatten().tolist())
        for row in logits
    ]
    params = SamplingParams(temperature=1.0, **settings)
    seen = [set() for _ in range(8)]
    for draw in range(300):
        for row, result in enumerate(sample(logits, inputs(params, range(8), draw=draw))):
            assert result.token_id in allowed[row]
            seen[row].add(result.token_id)
    assert seen == allowed, "every kept token is drawn at some point"


def test_temperature_one_draws_follow_the_softmax():
    """Chi-square of 40,000 draws from one row against its softmax."""
    logits = logits_rows(1, vocab=20, scale=1.5)
    params = SamplingParams(temperature=1.0)
    counts = torch.zeros(20)
    for draw in range(0, 40_000, 4_000):
        batch = [SampleInput(0, i, params, choice_seed(3, i), draw) for i in range(4_000)]
        for result in sample(logits, batch):
            counts[result.token_id] += 1
    expected = torch.softmax(logits[0].double(), -1) * counts.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 19 degrees of freedom: P(chi2 > 43.8) = 0.001 for a correct sampler.
    assert chi2 < 43.8, chi2


@pytest.mark.parametrize(
    "settings",
    [
        {"top_k": 40},
        {"top_k": 300, "temperature": 0.5},
        {"top_p": 0.8},
        {"top_p": 0.999},  # a wide nucleus: past the first candidates
        {"min_p": 1e-5},  # more kept than candidates: the masked full-row path
        {"temperature": 0.7, "top_k": 50, "top_p": 0.9, "min_p": 0.02},
    ],
)
def test_the_truncated_draw_is_the_inverse_cdf_of_the_truncated_row(settings):
    """The sampler draws from candidates when it can; the token must be the
    one the full masked row's CDF gives (bfloat16 values: many ties)."""
    logits = logits_rows(16, vocab=3000, scale=4.0).to(torch.bfloat16).float()
    params = SamplingParams(**settings)
    probs = probabilities(logits, inputs(params, range(16)))
    for draw in range(25):
        batch = inputs(params, range(16), draw=draw)
        u = uniform(torch.tensor([s.seed for s in batch]), torch.tensor([draw] * 16))
        assert [r.token_id for r in sample(logits, batch)] == invert_cdf(probs, u).tolist()


def test_a_truncated_seeded_row_ignores_its_neighbours_settings():
    """Other rows' top_k change how many candidates they take; not this row's."""
    target = logits_rows(1, vocab=5000, seed=9, scale=3.0).to(torch.bfloat16).float()[0]
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=3)
    neighbours = [
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=2000),
        SamplingParams(top_p=0.5, min_p=0.1),
        SamplingParams(frequency_penalty=1.0),
    ]
    draws = []
    for other in neighbours:
        logits = logits_rows(6, vocab=5000, seed=1)
        logits[4] = target
        tokens = []
        for draw in range(30):
            batch = [SampleInput(i, i, other, choice_seed(i, 0), draw) for i in range(6)]
            batch[4] = SampleInput(4, 4, params, choice_seed(3, 0), draw)
            tokens.append(sample(logits, batch)[4].token_id)
        draws.append(tokens)
    assert all(d == draws[0] for d in draws)
    assert len(set(draws[0])) > 3


@pytest.mark.parametrize("threads", [1, 2])
def test_greedy_tokens_are_argmax_on_ties_infinities_and_nan(threads):
    """The greedy path's max(dim).indices picks the index Tensor.argmax picks:
    the first maximum, NaN as the maximum, on rows long enough to be split
    across threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        scores = logits_rows(8, vocab=49152)
        scores[1, [100, 40000]] = 1e9  # a tie: the first wins
        scores[2] = float("-inf")
        scores[3, [5, 7]] = float("nan")
        scores[4, -1] = 1e9  # the last column
        scores[5] = 0.0  # all equal
        scores[6, [9, 7]] = float("inf")
        expected = scores.argmax(dim=-1)
        assert expected[:7].tolist()[1:] == [100, 0, 5, 49151, 0, 7]
        assert torch.equal(greedy_tokens(scores), expected)
    finally:
        torch.set_num_threads(previous)
