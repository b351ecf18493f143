"""Verification in the scheduler, no model: drafts scheduled as one
decode's extra query tokens, accepted prefixes kept, rejected slots and
blocks rolled back, nothing unverified in the prefix cache."""

from __future__ import annotations

import itertools

from gpuworkers.engine.config import EngineConfig
from gpuworkers.engine.kv_manager import KVCacheManager
from gpuworkers.engine.prefix_cache import hash_full_blocks
from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.engine.scheduling import Scheduler
from gpuworkers.engine.sequence import Request, Sequence

BLOCK = 4
_ids = itertools.count()


def make(num_blocks=16, **options):
    config = EngineConfig(block_size=BLOCK, num_kv_blocks=num_blocks, **options)
    kv = KVCacheManager(num_blocks, BLOCK, 0, True, "m")
    return Scheduler(config, kv, max_model_len=1024), kv


def add(scheduler, prompt, **params):
    request = Request(f"r{next(_ids)}", list(prompt), SamplingParams(**params))
    request.seqs.append(Sequence(next(_ids), request, 0, list(prompt), len(prompt)))
    scheduler.add(request.seqs[0])
    return request.seqs[0]


PROMPT = [1, 2, 3, 4, 1, 2, 3]


def prefilled(scheduler, max_tokens=20, **params):
    seq = add(scheduler, PROMPT, max_tokens=max_tokens, **params)
    out = scheduler.schedule()
    scheduler.on_step_done(out, [4])  # the prompt's first output: "1 2 3 4" recurs
    return seq


def test_a_decode_verifies_its_drafts_in_one_row_per_position():
    scheduler, kv = make()
    seq = prefilled(scheduler, frequency_penalty=0.5)
    out = scheduler.schedule()
    (item,) = out.seqs
    assert item.token_ids == [4, 1, 2, 3, 4] and item.num_drafts == 4
    assert item.positions == range(7, 12) and len(item.block_ids) == 3
    assert out.num_decodes == 0 and out.num_verifications == 1
    rows = [(s.row, s.spec_index, s.num_output_tokens) for s in out.samples]
    assert rows == [(j, j, 1 + j) for j in range(5)]
    # Penalties see the drafts before each position, as if emitted.
    assert out.samples[2].token_ids == PROMPT + [4, 1, 2]
    assert seq.num_tokens == 8  # drafts are not the sequence's yet


def test_rejected_drafts_are_rolled_back_and_never_cached():
    scheduler, kv = make()
    seq = prefilled(scheduler)
    free_before = kv.num_free
    out = scheduler.schedule()
    assert kv.num_free == free_before - 1  # a block for the drafts
    draft_block = out.seqs[0].block_ids[-1]
    # The first draft (1) rejected for 9: only the decode's own token counts.
    emitted = scheduler.on_step_done(out, [9, 9, 9, 9, 9])
    assert [out.samples[i].spec_index for _, i in emitted] == [0]
    assert seq.token_ids == PROMPT + [4, 9]
    assert seq.num_computed_tokens == 8 and len(seq.block_table) == 2
    assert kv.num_free == free_before and draft_block not in seq.block_table
    assert kv.allocator.blocks[draft_block].block_hash is None
    assert (seq.spec.drafted, seq.spec.accepted) == (4, 0)
    kv.allocator.check_invariants()


def test_a_partly_accepted_verification_keeps_only_verified_blocks_cached():
    scheduler, kv = make()
    seq = prefilled(scheduler)
    out = scheduler.schedule()
    # Targets: drafts 1 and 2 accepted, 3 rejected for 9.
    emitted = scheduler.on_step_done(out, [1, 2, 9, 9, 9])
    assert [out.samples[i].spec_index for _, i in emitted] == [0, 1, 2]
    assert seq.token_ids == PROMPT + [4, 1, 2, 9]
    assert seq.num_computed_tokens == 10 and len(seq.block_table) == 3
    assert (seq.spec.drafted, seq.spec.accepted) == (4, 2)
    # Two full blocks of verified tokens; the third holds rejected drafts'
    # K/V past position 9 and is not full of verified tokens: not cached.
    assert kv.allocator.num_cached == 2
    assert set(kv.allocator._cached) <= set(hash_full_blocks(seq.token_ids, BLOCK, "m", None))
    scheduler.remove(seq)
    assert kv.num_free == kv.num_total
    kv.allocator.check_invariants()


def test_accepted_drafts_advance_several_tokens_in_one_step():
    scheduler, kv = make()
    seq = prefilled(scheduler)
    out = scheduler.schedule()
    emitted = scheduler.on_step_done(out, [1, 2, 3, 4, 5])
    assert len(emitted) == 5
    assert seq.token_ids == PROMPT + [4, 1, 2, 3, 4, 5]
    assert seq.num_computed_tokens == 12 and len(seq.block_table) == 3
    # Blocks full of verified tokens are in the prefix cache.
    assert kv.allocator.num_cached == 3


def test_no_drafts_in_a_large_step_or_beyond_the_budget():
    scheduler, kv = make(speculative_max_batch=0)
    prefilled(scheduler)
    assert scheduler.schedule().seqs[0].num_drafts == 0
    scheduler, kv = make()
    prefilled(scheduler)
    scheduler.config.max_num_batched_tokens = 3
    assert scheduler.schedule().seqs[0].token_ids == [4, 1, 2]


def test_no_drafts_when_the_pool_has_no_block_for_them():
    scheduler, kv = make(num_blocks=2, admission_policy="optimistic")
    prefilled(scheduler)
    out = scheduler.schedule()
    # The decode's own slot is in block 2; the drafts would need a third.
    assert out.seqs[0].token_ids == [4] and out.seqs[0].num_drafts == 0
