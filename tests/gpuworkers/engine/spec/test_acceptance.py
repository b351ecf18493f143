"""Acceptance: the longest agreeing prefix, and the output distribution of
sampled verification (rejection sampling with point-mass drafts) against
the target distribution, through the real sampler on fixed logits."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from gpuworkers.engine.sampling import choice_seed, sample
from gpuworkers.engine.sampling.sampler import probabilities, process_logits
from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.engine.scheduling.batch import SampleInput
from gpuworkers.engine.spec import num_accepted

TRIALS = 6000
LOGITS = torch.tensor([[2.0, 1.2, 0.3, 0.0, -0.5, -1.0], [0.1, 1.5, -0.3, 0.9, 0.0, 0.4]])


def test_num_accepted_counts_the_agreeing_prefix():
    assert num_accepted([4, 5, 6], [4, 5, 6, 7]) == 3
    assert num_accepted([4, 5, 6], [4, 9, 6, 7]) == 1
    assert num_accepted([4, 5, 6], [1, 5, 6, 7]) == 0
    with pytest.raises(ValueError):
        num_accepted([4, 5], [4, 5])


def verify_many(params: SamplingParams, draft: int) -> list[tuple[int, int]]:
    """Emitted (first token, second token or -1) of TRIALS seeded
    verifications of one draft over the two fixed logits rows."""
    logits = LOGITS.repeat(TRIALS, 1)
    samples = []
    for trial in range(TRIALS):
        seed = choice_seed(trial, 0)
        samples.append(SampleInput(2 * trial, 0, params, seed, 10, spec_index=0))
        samples.append(SampleInput(2 * trial + 1, 0, params, seed, 11, spec_index=1))
    tokens = [r.token_id for r in sample(logits, samples)]
    emitted = []
    for trial in range(TRIALS):
        targets = tokens[2 * trial : 2 * trial + 2]
        kept = num_accepted([draft], targets)
        emitted.append((targets[0], targets[1] if kept else -1))
    return emitted


def target_probs(params: SamplingParams, row: int) -> torch.Tensor:
    probe = [SampleInput(row, 0, params)]
    probs = probabilities(process_logits(LOGITS, probe), probe)[0].double()
    return probs / probs.sum()


def assert_distributed_as(tokens: list[int], probs: torch.Tensor) -> None:
    support = (probs > 0).nonzero().squeeze(1).tolist()
    counts = [sum(1 for t in tokens if t == i) for i in support]
    assert sum(counts) == len(tokens), "a token outside the target's support"
    expected = [float(probs[i]) * len(tokens) for i in support]
    assert chisquare(counts, expected).pvalue > 1e-3, (counts, expected)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=4),
        SamplingParams(temperature=1.3, top_p=0.8),
    ],
    ids=["plain", "top-k", "top-p"],
)
@pytest.mark.parametrize("draft", [0, 3])
def test_emitted_tokens_follow_the_target_distribution(params, draft):
    """Accepted with probability p(draft); on rejection the token follows
    p with the draft removed and renormalised; so the first token follows
    p, and after an accepted draft the next follows its own row's p."""
    p_first, p_second = target_probs(params, 0), target_probs(params, 1)
    emitted = verify_many(params, draft)
    first = [f for f, _ in emitted]
    assert_distributed_as(first, p_first)
    rejected = [f for f, s in emitted if s == -1]
    accepted = len(emitted) - len(rejected)
    if p_first[draft] > 0:
        # Binomial(TRIALS, p(draft)): within 4 standard deviations.
        mean = TRIALS * float(p_first[draft])
        assert abs(accepted - mean) < 4 * (mean * (1 - float(p_first[draft]))) ** 0.5 + 1
    assert draft not in rejected
    residual = p_first.clone()
    residual[draft] = 0
    assert_distributed_as(rejected, residual / residual.sum())
    if accepted > 200:
        assert_distributed_as([s for _, s in emitted if s != -1], p_second)


def test_a_verified_position_draws_what_the_plain_sampler_draws():
    """Same seed and draw index, same token: a seeded request's tokens do
    not change when speculation turns on (given the same logits)."""
    params = SamplingParams(temperature=0.9, top_p=0.95)
    for trial in range(50):
        seed = choice_seed(trial, 0)
        plain = sample(LOGITS[1:], [SampleInput(0, 0, params, seed, 11)])[0].token_id
        spec = sample(LOGITS, [SampleInput(1, 0, params, seed, 11, spec_index=1)])[0].token_id
        assert plain == spec
