"""Scheduler and KV manager with tiny pools and no model.

A fake step hands the scheduler a made-up token for every sample the batch
asks for, which is all the scheduler can observe of the runner.
"""

from __future__ import annotations

import itertools

import pytest

from gpuworkers.engine.config import EngineConfig
from gpuworkers.engine.kv_manager import KVCacheManager
from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.engine.scheduling import Scheduler
from gpuworkers.engine.sequence import Request, Sequence, SequenceStatus

BLOCK = 4
_ids = itertools.count()


def make(num_blocks=16, host_blocks=16, **options):
    config = EngineConfig(block_size=BLOCK, num_kv_blocks=num_blocks, **options)
    kv = KVCacheManager(num_blocks, BLOCK, host_blocks, config.enable_prefix_caching, "m")
    return Scheduler(config, kv, max_model_len=1024), kv


def add(scheduler, prompt, max_tokens=4, priority=0, salt=None, n=1):
    params = SamplingParams(max_tokens=max_tokens, n=n)
    request = Request(f"r{next(_ids)}", list(prompt), params, priority, None, salt)
    for index in range(n):
        request.seqs.append(Sequence(next(_ids), request, index, list(prompt), len(prompt)))
    scheduler.add(request.seqs[0])
    return request.seqs[0]


def fake_step(scheduler, kv, token=7):
    out = scheduler.schedule()
    emitted = scheduler.on_step_done(out, [token] * len(out.samples))
    finished = []
    for seq, _ in emitted:
        if not seq.is_finished and seq.num_output_tokens >= seq.request.params.max_tokens:
            scheduler.remove(seq)
            seq.status = SequenceStatus.FINISHED
            finished.append(seq)
    return out, finished


def run_all(scheduler, kv, limit=500):
    steps = 0
    while scheduler.has_unfinished():
        fake_step(scheduler, kv)
        for seq in scheduler.running:
            # Waste: allocated slots beyond the tokens held stay under a block.
            assert len(seq.block_table) * BLOCK - seq.num_computed_tokens < BLOCK + 1
        kv.allocator.check_invariants()
        steps += 1
        assert steps < limit
    return steps


def test_free_count_returns_to_total_after_all_requests_end():
    scheduler, kv = make()
    for length in (3, 9, 14, 5):
        add(scheduler, range(100, 100 + length), max_tokens=6)
    run_all(scheduler, kv)
    assert kv.num_free == kv.num_total


def test_waste_is_under_one_block_per_sequence():
    scheduler, kv = make(num_blocks=64)
    seqs = [add(scheduler, range(n), max_tokens=9) for n in (1, 4, 5, 17)]
    for _ in range(6):
        fake_step(scheduler, kv)
        for seq in seqs:
            if seq.status is SequenceStatus.RUNNING:
                held = len(seq.block_table) * BLOCK
                assert held - seq.num_computed_tokens <= BLOCK - 1 + 1  # +1: the slot being written


def test_decodes_come_before_prefill_chunks_within_the_budget():
    scheduler, kv = make(num_blocks=64, max_num_batched_tokens=8)
    first = add(scheduler, range(3), max_tokens=5)
    fake_step(scheduler, kv)  # prefill of the first request
    second = add(scheduler, range(50, 70), max_tokens=5)
    out, _ = fake_step(scheduler, kv)
    assert out.seqs[0].seq_id == first.seq_id and out.seqs[0].num_new_tokens == 1
    assert out.seqs[1].seq_id == second.seq_id and out.seqs[1].num_new_tokens == 7
    assert out.num_batched_tokens <= 8


def test_abort_frees_blocks_immediately():
    scheduler, kv = make()
    seq = add(scheduler, range(10), max_tokens=50)
    fake_step(scheduler, kv)
    assert kv.num_free < kv.num_total
    scheduler.remove(seq)
    assert kv.num_free == kv.num_total
    assert not scheduler.has_unfinished()


def test_reserve_policy_admits_only_what_can_finish():
    scheduler, kv = make(num_blocks=8)
    a = add(scheduler, range(4), max_tokens=12)  # reserves 4 blocks
    b = add(scheduler, range(8), max_tokens=12)  # reserves 5 more: must wait
    fake_step(scheduler, kv)
    assert a.status is SequenceStatus.RUNNING and b.status is SequenceStatus.WAITING
    run_all(scheduler, kv)
    assert scheduler.num_preemptions == 0
    assert kv.num_free == kv.num_total


def test_optimistic_policy_preempts_lowest_priority_newest_by_swapping():
    scheduler, kv = make(num_blocks=6, host_blocks=16, admission_policy="optimistic")
    high = add(scheduler, range(4), max_tokens=12, priority=2)
    low_old = add(scheduler, range(10, 14), max_tokens=12, priority=0)
    low_new = add(scheduler, range(20, 24), max_tokens=12, priority=0)
    preempted_first = None
    while scheduler.has_unfinished():
        fake_step(scheduler, kv)
        if preempted_first is None and scheduler.swapped:
            preempted_first = scheduler.swapped[0]
        kv.allocator.check_invariants()
    assert preempted_first is low_new
    assert scheduler.num_swaps_out > 0 and scheduler.num_swaps_in == scheduler.num_swaps_out
    assert scheduler.num_recomputes == 0
    assert all(s.num_output_tokens == 12 for s in (high, low_old, low_new))
    assert kv.num_free == kv.num_total and kv.host.num_free == kv.host.num_blocks


def test_recompute_when_host_pool_is_full():
    scheduler, kv = make(num_blocks=6, host_blocks=0, admission_policy="optimistic")
    seqs = [add(scheduler, range(i * 10, i * 10 + 4), max_tokens=12) for i in range(3)]
    run_all(scheduler, kv)
    assert scheduler.num_recomputes > 0 and scheduler.num_swaps_out == 0
    assert all(s.num_output_tokens == 12 for s in seqs)
    assert kv.num_free == kv.num_total


def test_prefix_cache_reuses_only_exact_leading_full_blocks():
    scheduler, kv = make(num_blocks=32)
    first = add(scheduler, range(10), max_tokens=1)
    run_all(scheduler, kv)
    assert first.num_cached_tokens == 0
    same_prefix = add(scheduler, list(range(10)) + [99], max_tokens=1)
    fake_step(scheduler, kv)
    assert same_prefix.num_cached_tokens == 8  # two full blocks of 4
    run_all(scheduler, kv)
    different_start = add(scheduler, [5] + list(range(1, 10)), max_tokens=1)
    fake_step(scheduler, kv)
    assert different_start.num_cached_tokens == 0
    run_all(scheduler, kv)
    salted = add(scheduler, range(10), max_tokens=1, salt="tenant-b")
    fake_step(scheduler, kv)
    assert salted.num_cached_tokens == 0, "another tenant's salt never hits"
    run_all(scheduler, kv)


def test_ten_turn_conversation_prefills_only_new_tokens():
    """Each turn recomputes its new tokens plus at most one partial block."""
    scheduler, kv = make(num_blocks=256)
    history = list(range(1000, 1020))  # system prompt
    for turn in range(10):
        history = history + [2000 + turn * 10 + i for i in range(7)]  # user message
        seq = add(scheduler, history, max_tokens=5)
        computed = 0
        while scheduler.has_unfinished():
            out, _ = fake_step(scheduler, kv)
            # Prompt chunks: every step until the first output token.
            computed += sum(
                i.num_new_tokens
                for i in out.seqs
                if i.seq_id == seq.seq_id and seq.num_output_tokens <= 1
            )
        prompt_computed = len(history) - seq.num_cached_tokens
        new_tokens = 7 if turn == 0 else 7 + 5  # user turn + last assistant reply
        if turn == 0:
            new_tokens += 20
        assert computed == prompt_computed, f"turn {turn}: cached tokens were computed again"
        assert computed <= new_tokens + BLOCK - 1, f"turn {turn}"
        history = seq.token_ids  # the reply joins the history
    assert kv.num_free == kv.num_total


def test_copy_on_write_for_forked_choices():
    scheduler, kv = make(num_blocks=16)
    parent = add(scheduler, range(6), max_tokens=4, n=2)
    child = parent.request.seqs[1]
    out, _ = fake_step(scheduler, kv)  # prompt computed: 6 tokens, second block partial
    assert out.forks == [parent.seq_id]
    assert [(s.row, s.seq_id) for s in out.samples] == [(0, parent.seq_id), (0, child.seq_id)]
    assert child.status is SequenceStatus.RUNNING and child in scheduler.running
    assert child.num_computed_tokens == parent.num_computed_tokens == 6
    assert child.token_ids == parent.token_ids == list(range(6)) + [7]
    shared_last = parent.block_table[-1]
    assert child.block_table == parent.block_table
    assert kv.allocator.ref_count(shared_last) == 2
    out, _ = fake_step(scheduler, kv)
    assert out.cache_ops.copies, "the shared partial block is copied before either writes"
    assert parent.block_table[-1] != child.block_table[-1]
    assert parent.block_table[0] == child.block_table[0]  # full blocks stay shared
    run_all(scheduler, kv)
    assert kv.num_free == kv.num_total


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_ordering_policy(policy):
    scheduler, kv = make(num_blocks=64, max_num_seqs=1, scheduling_policy=policy)
    low = add(scheduler, range(4), max_tokens=1, priority=0)
    high = add(scheduler, range(10, 14), max_tokens=1, priority=5)
    out, _ = fake_step(scheduler, kv)
    expected = low if policy == "fcfs" else high
    assert out.seqs[0].seq_id == expected.seq_id


# The runner's snapshot ----------------------------------------------------


def test_snapshot_of_a_decode():
    """A decode runs the last sampled token at the next position, writing
    into the partial second block."""
    scheduler, kv = make(num_blocks=16)
    seq = add(scheduler, range(100, 106), max_tokens=4)  # one full block, one partial
    fake_step(scheduler, kv, token=42)
    out = scheduler.schedule()
    (item,) = out.seqs
    table = seq.block_table
    assert item.seq_id == seq.seq_id
    assert item.token_ids == [42]
    assert item.positions == range(6, 7)
    assert item.block_ids == table and len(table) == 2
    assert item.slot_mapping == [table[1] * BLOCK + 2]
    assert item.needs_logits
    assert [(s.row, s.seq_id) for s in out.samples] == [(0, seq.seq_id)]
    assert out.num_decodes == 1 and out.num_prompt_tokens == 0 and not out.forks
    assert not out.cache_ops


def test_snapshot_of_a_chunked_prefill():
    """A 10-token prompt under a 4-token budget: chunks 4, 4, 2, each with
    its positions, the blocks it reads and writes, and its slots; only the
    last one is sampled. Each snapshot is a copy: later growth of the block
    table does not change it."""
    scheduler, kv = make(num_blocks=16, max_num_batched_tokens=4)
    prompt = list(range(200, 210))
    seq = add(scheduler, prompt, max_tokens=2)
    batches = [fake_step(scheduler, kv)[0] for _ in range(3)]
    chunks = [b.seqs[0] for b in batches]
    table = seq.block_table
    assert [c.token_ids for c in chunks] == [prompt[0:4], prompt[4:8], prompt[8:10]]
    assert [c.positions for c in chunks] == [range(0, 4), range(4, 8), range(8, 10)]
    assert [c.block_ids for c in chunks] == [table[:1], table[:2], table[:3]]
    assert chunks[0].slot_mapping == [table[0] * BLOCK + i for i in range(4)]
    assert chunks[1].slot_mapping == [table[1] * BLOCK + i for i in range(4)]
    assert chunks[2].slot_mapping == [table[2] * BLOCK + i for i in range(2)]
    assert [c.needs_logits for c in chunks] == [False, False, True]
    assert [len(b.samples) for b in batches] == [0, 0, 1]
    assert [b.num_prompt_tokens for b in batches] == [4, 4, 2]
    assert [b.num_decodes for b in batches] == [0, 0, 0]


def test_batch_puts_decodes_first_by_context_length_and_rows_follow_the_order():
    scheduler, kv = make(num_blocks=64)
    long = add(scheduler, range(0, 9), max_tokens=5)
    short = add(scheduler, range(20, 23), max_tokens=5)
    fake_step(scheduler, kv)
    late = add(scheduler, range(40, 50), max_tokens=5)
    out = scheduler.schedule()
    assert [i.seq_id for i in out.seqs] == [short.seq_id, long.seq_id, late.seq_id]
    assert [i.num_new_tokens for i in out.seqs] == [1, 1, 10]
    assert out.num_decodes == 2
    rows = [(s.row, s.seq_id) for s in out.samples]
    assert rows == [(0, short.seq_id), (1, long.seq_id), (2, late.seq_id)]
    with pytest.raises(ValueError, match="sampled tokens"):
        scheduler.on_step_done(out, [7, 7])
    assert late.num_computed_tokens == 0, "a refused result changes nothing"
    scheduler.on_step_done(out, [7, 8, 9])
    assert (short.token_ids[-1], long.token_ids[-1], late.token_ids[-1]) == (7, 8, 9)
    assert late.num_computed_tokens == 10


def test_preemption_hands_the_runner_the_swap_copies():
    """The swap-out pairs are the victim's device blocks and its new host
    blocks; the victim is not in the step's batch."""
    scheduler, kv = make(num_blocks=6, host_blocks=16, admission_policy="optimistic")
    for i in range(3):
        add(scheduler, range(i * 10, i * 10 + 4), max_tokens=12)
    for _ in range(20):
        tables = {s.seq_id: list(s.block_table) for s in scheduler.running}
        out, _ = fake_step(scheduler, kv)
        if out.cache_ops.swap_out:
            break
    (victim,) = scheduler.swapped
    assert [device for device, _ in out.cache_ops.swap_out] == tables[victim.seq_id]
    assert [host for _, host in out.cache_ops.swap_out] == victim.host_block_table
    assert victim.seq_id not in {i.seq_id for i in out.seqs}
    run_all(scheduler, kv)


# n > 1 and the sequence cap --------------------------------------------------


@pytest.mark.parametrize("admission", ["reserve", "optimistic"])
def test_forked_choices_never_push_running_past_max_num_seqs(admission):
    """An n-choice request takes n seats when its prompt starts, so its
    forks never overfill ``running``; under pressure (optimistic, a tiny
    pool) preempted prompts take their n seats again to come back."""
    scheduler, kv = make(
        num_blocks=24, host_blocks=8, max_num_seqs=4, max_num_batched_tokens=6,
        admission_policy=admission,
    )  # fmt: skip
    requests = [
        add(scheduler, range(100, 103), max_tokens=6).request,
        add(scheduler, range(200, 202), max_tokens=6).request,
        add(scheduler, range(300, 310), max_tokens=6, n=3).request,
        add(scheduler, range(400, 405), max_tokens=6, n=2).request,
        add(scheduler, range(500, 503), max_tokens=6, n=4).request,
    ]
    most = 0
    for _ in range(300):
        if not scheduler.has_unfinished():
            break
        fake_step(scheduler, kv)
        most = max(most, len(scheduler.running))
        assert len(scheduler.running) <= 4, [s.seq_id for s in scheduler.running]
        kv.allocator.check_invariants()
    assert not scheduler.has_unfinished()
    assert most == 4, "the cap is reached, not avoided"
    for request in requests:
        assert all(s.num_output_tokens == 6 for s in request.seqs)
    assert kv.num_free == kv.num_total


def test_an_n_choice_prompt_waits_for_n_free_seats():
    """Two seats taken out of four: a three-choice prompt does not start
    (strict order: nothing behind it either) until a third seat is free."""
    scheduler, kv = make(num_blocks=64, max_num_seqs=4)
    short = add(scheduler, range(10, 12), max_tokens=2)
    long = add(scheduler, range(20, 22), max_tokens=8)
    fake_step(scheduler, kv)
    parent = add(scheduler, range(30, 35), max_tokens=2, n=3)
    behind = add(scheduler, range(40, 42), max_tokens=2)
    fake_step(scheduler, kv)  # short finishes this step
    assert parent.status is SequenceStatus.WAITING and behind.status is SequenceStatus.WAITING
    assert short.is_finished and long in scheduler.running
    fake_step(scheduler, kv)
    assert parent in scheduler.running and behind.status is SequenceStatus.WAITING
    run_all(scheduler, kv)


# Prefix-cache registration ----------------------------------------------------


def test_full_blocks_are_registered_once_not_every_step():
    """Each full block is published to the prefix cache once, when it
    fills, not again on every later step of its sequence."""
    scheduler, kv = make(num_blocks=64)
    calls = []
    register = kv.allocator.register
    kv.allocator.register = lambda block_id, block_hash: (
        calls.append(block_id),
        register(block_id, block_hash),
    )
    seq = add(scheduler, range(50, 59), max_tokens=20)  # 9 + 20 tokens: 7 full blocks
    run_all(scheduler, kv)
    assert seq.num_tokens == 29
    assert sorted(set(calls)) == sorted(calls), "a block registered twice"
    assert len(calls) == 29 // BLOCK
    again = add(scheduler, seq.token_ids, max_tokens=1)
    fake_step(scheduler, kv)
    assert again.num_cached_tokens == 28, "every full block was findable"
