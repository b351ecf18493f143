"""The n-gram drafter: matches, n range, k, and the back-off policy."""

from __future__ import annotations

import pytest

from gpuworkers.engine.config import EngineConfig
from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.engine.sequence import Request, Sequence
from gpuworkers.engine.spec import NgramDrafter, Speculator
from gpuworkers.engine.spec.speculator import BACKOFF_TOKENS


def test_proposes_what_followed_the_most_recent_earlier_occurrence():
    drafter = NgramDrafter(2, 2, k=3)
    ids = [5, 6, 1, 2, 3, 9, 5, 6, 4, 4, 8, 5, 6]
    # "5 6" occurred at 0 (then 1 2 3) and at 6 (then 4 4 8): the latest wins.
    assert drafter.propose(ids) == [4, 4, 8]


def test_longest_ngram_first_down_to_min_n():
    ids = [1, 2, 3, 40, 41, 9, 2, 3, 50, 51, 0, 1, 2, 3]
    # The 3-gram "1 2 3" is at 0 (then 40 41); the later 2-gram "2 3" at 6
    # (then 50 51) only counts when the 3-gram is not tried.
    assert NgramDrafter(2, 3, k=2).propose(ids) == [40, 41]
    assert NgramDrafter(2, 2, k=2).propose(ids) == [50, 51]


def test_respects_min_n():
    ids = [7, 1, 2, 8, 9, 3, 7]  # only the 1-gram "7" recurs
    assert NgramDrafter(2, 4, k=3).propose(ids) == []
    assert NgramDrafter(1, 4, k=3).propose(ids) == [1, 2, 8]


def test_respects_k_the_callers_cap_and_the_end_of_the_sequence():
    ids = [1, 2, 3, 4, 5, 6, 1, 2]
    drafter = NgramDrafter(2, 2, k=3)
    assert drafter.propose(ids) == [3, 4, 5]
    assert drafter.propose(ids, k=2) == [3, 4]
    assert drafter.propose(ids, k=9) == [3, 4, 5]  # never more than its own k
    assert drafter.propose(ids, k=0) == []
    # The match's continuation runs into the suffix itself: shorter draft.
    assert NgramDrafter(2, 2, k=4).propose([8, 8, 8]) == [8]


def test_never_matches_the_suffix_itself_or_across_token_boundaries():
    assert NgramDrafter(1, 3, k=2).propose([1, 2, 3]) == []
    # int64 little-endian: 256 then 0 holds the bytes of token 1 at an
    # offset of one byte; that is not an occurrence of token 1.
    assert NgramDrafter(1, 1, k=2).propose([256, 0, 9, 5, 1]) == []
    assert NgramDrafter(1, 1, k=2).propose([256, 1, 9, 5, 1]) == [9, 5]


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError):
        NgramDrafter(3, 2, k=1)
    with pytest.raises(ValueError):
        EngineConfig(prompt_lookup_min=3, prompt_lookup_max=2)
    with pytest.raises(ValueError):
        EngineConfig(speculative_method="eagle")


def decoding(params: SamplingParams, outputs: list[int]) -> Sequence:
    prompt = [1, 2, 3, 4, 1, 2]
    request = Request("r", prompt, params)
    seq = Sequence(0, request, 0, prompt + outputs, len(prompt))
    request.seqs.append(seq)
    seq.num_computed_tokens = seq.num_tokens - 1  # in pure decode
    return seq


def test_speculator_caps_drafts_by_max_tokens_and_context():
    speculator = Speculator(EngineConfig(num_speculative_tokens=4))
    seq = decoding(SamplingParams(max_tokens=8), [3])  # "1 2 3" recurs: 4 1 2 3
    assert speculator.propose(seq, budget=100, max_model_len=100) == [4, 1, 2, 3]
    assert speculator.propose(seq, budget=2, max_model_len=100) == [4, 1]
    # Room for the target after the drafts: 9 - 7 tokens - 1.
    assert speculator.propose(seq, budget=100, max_model_len=9) == [4]
    short = decoding(SamplingParams(max_tokens=3), [3])
    assert speculator.propose(short, budget=100, max_model_len=100) == [4]


def test_speculation_off_by_config_batch_size_and_for_structured_output():
    assert not Speculator(EngineConfig(speculative_method=None)).step_allows(1)
    speculator = Speculator(EngineConfig(speculative_max_batch=4))
    assert speculator.step_allows(4) and not speculator.step_allows(5)

    class Structured(SamplingParams):
        """SamplingParams with the grammar field another branch adds."""

    params = Structured(max_tokens=8)
    params.structured_output = {"type": "json"}
    assert speculator.propose(decoding(params, [3]), 100, 100) == []


def test_a_sequence_with_poor_acceptance_backs_off_then_retries():
    speculator = Speculator(EngineConfig(speculative_min_acceptance=0.25))
    seq = decoding(SamplingParams(max_tokens=200), [3])
    for _ in range(4):
        speculator.record(seq, drafted=4, accepted=0)
        assert speculator.propose(seq, 100, 1000)  # still trying
    speculator.record(seq, drafted=4, accepted=0)
    assert seq.spec.paused_until == seq.num_output_tokens + BACKOFF_TOKENS
    assert speculator.propose(seq, 100, 1000) == []
    seq.token_ids += [4, 1, 2, 3] * 8  # BACKOFF_TOKENS more outputs
    seq.num_computed_tokens = seq.num_tokens - 1
    assert speculator.propose(seq, 100, 1000) == [4, 1, 2, 3]
    assert (seq.spec.drafted, seq.spec.accepted) == (20, 0)
    assert speculator.stats() == {
        "spec_verifications": 5,
        "spec_draft_tokens": 20,
        "spec_accepted_tokens": 0,
        "spec_accepted_per_pos": [0, 0, 0, 0],
    }
    # vLLM's per-position counts: a verification keeping 2 of 4 drafts
    # counts positions 0 and 1.
    speculator.record(seq, drafted=4, accepted=2)
    assert speculator.stats()["spec_accepted_per_pos"] == [1, 1, 0, 0]


def test_plan_verifies_every_draft_of_a_small_batch():
    speculator = Speculator(EngineConfig(speculative_fixed_cost_rows=10.0))
    seqs = [decoding(SamplingParams(max_tokens=50), [3]) for _ in range(2)]
    assert speculator.plan(seqs, step_rows=2, budget=100, max_model_len=100) == [[4, 1, 2, 3]] * 2


def test_plan_at_a_large_batch_keeps_only_drafts_likely_enough_to_pay():
    speculator = Speculator(EngineConfig(speculative_fixed_cost_rows=10.0))
    seqs = [decoding(SamplingParams(max_tokens=50), [3]) for _ in range(32)]
    for seq in seqs[:16]:
        seq.spec.recent_rate = 0.5  # a draft pays 0.5 tokens for a row
    for seq in seqs[16:]:
        seq.spec.recent_rate = 0.95
    plans = speculator.plan(seqs, step_rows=32, budget=1000, max_model_len=100)
    # 32 outputs for 10 + 32 row-costs: a draft must be worth more than
    # 0.76 tokens, so none worth 0.5. Of the others (depths worth 0.95,
    # 0.90, 0.86, 0.81) each taken draft raises the bar: after three
    # depths it is (32 + 16 * 2.71) / (10 + 80) = 0.84, above the fourth.
    assert plans[:16] == [[]] * 16
    assert plans[16:] == [[4, 1, 2]] * 16
    # The same sequences in a step twice the size: the bar starts at
    # 64 / 74 = 0.86 and after two depths is 93.6 / 106 = 0.88.
    more = seqs + [decoding(SamplingParams(max_tokens=50), [9]) for _ in range(32)]
    plans = speculator.plan(more, step_rows=64, budget=1000, max_model_len=100)
    assert plans[16:32] == [[4, 1]] * 16 and plans[:16] == [[]] * 16


def test_plan_spends_the_budget_on_the_likeliest_drafts_first():
    speculator = Speculator(EngineConfig(speculative_fixed_cost_rows=10.0))
    seqs = [decoding(SamplingParams(max_tokens=50), [3]) for _ in range(3)]
    for seq, rate in zip(seqs, (0.7, 1.0, 0.9), strict=True):
        seq.spec.recent_rate = rate
    plans = speculator.plan(seqs, step_rows=3, budget=6, max_model_len=100)
    assert [len(p) for p in plans] == [0, 4, 2]
    assert plans[2] == [4, 1]  # a prefix of the full draft
