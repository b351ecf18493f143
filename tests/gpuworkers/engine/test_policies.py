"""Scheduling policies on their own and through the scheduler, with tiny
pools and no model: queue order, victim choice, chunk caps, admission."""

from __future__ import annotations

import itertools

import pytest

from gpuworkers.engine.config import EngineConfig
from gpuworkers.engine.kv_manager import KVCacheManager
from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.engine.scheduling import (
    FairPolicy,
    FCFSPolicy,
    PriorityPolicy,
    Queues,
    Scheduler,
    SchedulingPolicy,
)
from gpuworkers.engine.scheduling.capacity import Capacity
from gpuworkers.engine.sequence import Request, Sequence, SequenceStatus

BLOCK = 4
_ids = itertools.count()
WEIGHTS = {"enterprise": 0.5, "pro": 0.35, "free": 0.15}


def seq(priority=0, tier=None, arrival=None, prompt_len=4, max_tokens=4, status=None):
    """A one-choice request's sequence; ``arrival`` orders requests explicitly."""
    n = next(_ids)
    prompt = [1000 + n * 50 + i for i in range(prompt_len)]
    request = Request(f"r{n}", prompt, SamplingParams(max_tokens=max_tokens), priority, tier)
    if arrival is not None:
        request.arrival_time = arrival
    s = Sequence(next(_ids), request, 0, list(prompt), prompt_len)
    s.status = status or SequenceStatus.WAITING
    request.seqs.append(s)
    return s


def make(num_blocks=64, host_blocks=64, **options):
    config = EngineConfig(block_size=BLOCK, num_kv_blocks=num_blocks, **options)
    kv = KVCacheManager(num_blocks, BLOCK, host_blocks, config.enable_prefix_caching, "m")
    return Scheduler(config, kv, max_model_len=1024), kv


def fair_policy(num_blocks=64, max_num_seqs=8, **options):
    config = EngineConfig(block_size=BLOCK, num_kv_blocks=num_blocks, **options)
    kv = KVCacheManager(num_blocks, BLOCK, 0, True, "m")
    return FairPolicy(WEIGHTS, Capacity(config, kv, 1024), max_num_seqs)


def step(scheduler):
    out = scheduler.schedule()
    for s, _ in scheduler.on_step_done(out, [7] * len(out.samples)):
        if not s.is_finished and s.num_output_tokens >= s.request.params.max_tokens:
            scheduler.remove(s)
            s.status = SequenceStatus.FINISHED
    return out


@pytest.mark.parametrize(
    ("name", "cls"), [("fcfs", FCFSPolicy), ("priority", PriorityPolicy), ("fair", FairPolicy)]
)
def test_the_configured_name_picks_the_policy(name, cls):
    scheduler, _ = make(scheduling_policy=name)
    assert type(scheduler.policy) is cls and scheduler.policy.name == name
    assert isinstance(scheduler.policy, SchedulingPolicy)


def test_fcfs_orders_by_arrival_and_ignores_priority():
    early, late = seq(priority=0, arrival=1.0), seq(priority=9, arrival=2.0)
    assert sorted([late, early], key=FCFSPolicy().queue_key) == [early, late]


def test_priority_orders_by_priority_then_arrival():
    low, high_late, high_early = seq(0, arrival=1.0), seq(5, arrival=3.0), seq(5, arrival=2.0)
    ordered = sorted([low, high_late, high_early], key=PriorityPolicy().queue_key)
    assert ordered == [high_early, high_late, low]


def test_swapped_sequences_start_before_waiting_ones_in_strict_order():
    """next_to_admit offers swapped sequences first; once one does not fit,
    nothing behind it (swapped or waiting) is offered."""
    policy = PriorityPolicy()
    swapped = [seq(0, arrival=5.0, status=SequenceStatus.SWAPPED) for _ in range(2)]
    waiting = [seq(9, arrival=1.0)]
    policy.begin_step(Queues(waiting=waiting, swapped=swapped), budget=64)
    assert policy.next_to_admit() is swapped[0]
    policy.admitted(swapped[0], 4)
    assert policy.next_to_admit() is swapped[1]
    policy.admitted(swapped[1], 0)
    assert policy.next_to_admit() is None


def test_base_policy_neither_claims_nor_caps():
    policy = FCFSPolicy()
    queues = Queues(waiting=[seq()], running=[seq(status=SequenceStatus.RUNNING)])
    assert policy.begin_step(queues, budget=32) == []
    assert policy.reclaim_victim(queues.waiting[0]) is None
    assert policy.chunk_cap(queues.running[0], 32) == 32


@pytest.mark.parametrize("name", ["fcfs", "priority"])
def test_growth_victim_is_the_last_served(name):
    """When running sequences outgrow the pool, the victim is the newest
    (FCFS) or the newest of the lowest priority (Priority)."""
    scheduler, kv = make(num_blocks=6, scheduling_policy=name, admission_policy="optimistic")
    old_high = seq(priority=5, arrival=1.0, max_tokens=12)
    mid_low = seq(priority=0, arrival=2.0, max_tokens=12)
    new_high = seq(priority=5, arrival=3.0, max_tokens=12)
    for s in (old_high, mid_low, new_high):
        scheduler.add(s)
    while not scheduler.swapped:
        step(scheduler)
    expected = new_high if name == "fcfs" else mid_low
    assert scheduler.swapped == [expected]


# Fair ---------------------------------------------------------------------


def test_fair_queue_order_puts_swapped_first_then_priority():
    policy = fair_policy()
    waiting_high = seq(priority=9, arrival=1.0)
    swapped_low = seq(priority=0, arrival=2.0, status=SequenceStatus.SWAPPED)
    assert sorted([waiting_high, swapped_low], key=policy.queue_key) == [swapped_low, waiting_high]


def test_fair_tier_label_folds_unknown_tiers_into_the_lowest():
    policy = fair_policy()
    assert policy.tier_label(seq(tier="pro")) == "pro"
    assert policy.tier_label(seq(tier=None)) == "free"
    assert policy.tier_label(seq(tier="platinum")) == "free"


def running(tier, count, prompt_len=4):
    return [
        seq(tier=tier, prompt_len=prompt_len, status=SequenceStatus.RUNNING) for _ in range(count)
    ]


def test_fair_claims_are_the_heads_of_under_share_tiers():
    """Free holds every slot; pro queues: pro's head claims, free's does not."""
    policy = fair_policy(max_num_seqs=4)
    queues = Queues(running=running("free", 4))
    pro_first, pro_second = seq(tier="pro", arrival=1.0), seq(tier="pro", arrival=2.0)
    queues.waiting = [pro_second, seq(tier="free"), pro_first]
    assert policy.begin_step(queues, budget=64) == [pro_first]


def test_fair_reclaim_takes_the_newest_of_the_most_over_share_tier():
    policy = fair_policy(max_num_seqs=4)
    free = running("free", 4)
    queues = Queues(running=free, waiting=[seq(tier="pro")])
    (claim,) = policy.begin_step(queues, budget=64)
    assert policy.reclaim_victim(claim) is free[-1]


def test_fair_reclaim_never_pushes_a_tier_below_its_claimant():
    """Pro holds one slot of two and enterprise claims: taking pro's only
    sequence would leave pro below enterprise relative to their shares."""
    policy = fair_policy(max_num_seqs=2)
    pro = running("pro", 1)
    queues = Queues(running=pro, waiting=[seq(tier="enterprise")])
    policy.begin_step(queues, budget=64)
    assert policy.reclaim_victim(queues.waiting[0]) is None


def test_fair_growth_victim_comes_from_the_tier_over_its_share():
    policy = fair_policy(max_num_seqs=4)
    pro, free = running("pro", 1), running("free", 3)
    queues = Queues(running=pro + free)
    policy.begin_step(queues, budget=64)
    policy.serving_key()
    assert policy.pick_victim([pro[0], free[0], free[1]]) is free[1]
    # No tier over its share among the candidates: lowest priority, newest.
    assert policy.pick_victim([pro[0]]) is pro[0]


def test_fair_chunk_cap_is_credit_or_what_other_tiers_leave_over():
    """Pro (share 0.7 of 100) may take its 70 while free wants more than the
    rest; when free wants little, pro may take what free leaves over."""
    for free_len, expected in ((200, 70), (10, 90)):
        policy = fair_policy()
        pro = seq(tier="pro", prompt_len=200)
        policy.begin_step(Queues(waiting=[pro, seq(tier="free", prompt_len=free_len)]), 100)
        policy.serving_key()
        assert policy.chunk_cap(pro, 100) == expected


def test_fair_admission_by_credit_and_a_misfit_ends_only_its_tiers_turn():
    policy = fair_policy()
    pro, free = seq(tier="pro"), seq(tier="free")
    policy.begin_step(Queues(waiting=[free, pro, seq(tier="pro")]), budget=64)
    policy.serving_key()
    assert policy.next_to_admit() is pro, "pro has the most credit (0.7 of the budget)"
    policy.admitted(pro, 0)
    assert policy.next_to_admit() is free
    policy.admitted(free, 4)
    assert policy.next_to_admit() is None


def test_fair_over_share_tiers_start_nothing_while_another_tier_claims():
    policy = fair_policy(max_num_seqs=8)
    pro = [seq(tier="pro", arrival=float(i)) for i in range(2)]
    queues = Queues(running=running("free", 3), waiting=[seq(tier="free"), *pro])
    assert policy.begin_step(queues, budget=64) == [pro[0]]
    policy.serving_key()
    for expected in pro:
        assert policy.next_to_admit() is expected
        policy.admitted(expected, 4)
    assert policy.next_to_admit() is None, "free is over its share: it waits"


# Decodes first, whatever the order -------------------------------------------


@pytest.mark.parametrize("name", ["fcfs", "priority", "fair"])
def test_every_decode_gets_its_token_before_an_older_higher_priority_prefill(name):
    """Three young low-priority sequences decode while an older,
    higher-priority 60-token prompt prefills under an 8-token budget: every
    step each decode gets its token and the prompt takes what is left.
    Arrival or priority order would hand the prompt the whole budget."""
    scheduler, _ = make(scheduling_policy=name, max_num_batched_tokens=8)
    decoders = [seq(priority=0, arrival=10.0 + i, prompt_len=2, max_tokens=30) for i in range(3)]
    for s in decoders:
        scheduler.add(s)
    step(scheduler)  # the three prompts (6 tokens) in one step
    assert all(s.num_output_tokens == 1 for s in decoders)
    prompt = seq(priority=5, arrival=1.0, prompt_len=60, max_tokens=4)
    scheduler.add(prompt)
    chunks = []
    while prompt.num_output_tokens == 0:
        out = step(scheduler)
        tokens = {item.seq_id: item.num_new_tokens for item in out.seqs}
        assert [tokens.get(s.seq_id) for s in decoders] == [1, 1, 1], tokens
        chunks.append(tokens.get(prompt.seq_id, 0))
        assert out.num_batched_tokens <= 8
    assert chunks[:-1] == [5] * (len(chunks) - 1) and sum(chunks) == 60


# Fair: determinism ------------------------------------------------------------


def test_fair_claim_order_breaks_credit_ties_by_queue_order_not_by_hash():
    """Tiers of equal weight and credit claim in their heads' queue order
    (the set of claimants used to be iterated in PYTHONHASHSEED order)."""
    config = EngineConfig(block_size=BLOCK, num_kv_blocks=64)
    kv = KVCacheManager(64, BLOCK, 0, True, "m")
    names = ["delta", "alpha", "echo", "charlie", "bravo", "foxtrot"]
    policy = FairPolicy(dict.fromkeys(names, 1.0), Capacity(config, kv, 1024), 8)
    heads = [seq(tier=tier, arrival=float(i)) for i, tier in enumerate(names)]
    claims = policy.begin_step(Queues(waiting=list(reversed(heads))), budget=60)
    assert claims == heads
