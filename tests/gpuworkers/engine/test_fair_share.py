"""Weighted fair share between tiers, with tiny pools and no model.

As in test_scheduler, a fake step hands the scheduler a made-up token for
every sample the batch asks for.
"""

from __future__ import annotations

import itertools
from collections import Counter

from gpuworkers.engine.config import EngineConfig
from gpuworkers.engine.kv_manager import KVCacheManager
from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.engine.scheduling import FCFSPolicy, Scheduler
from gpuworkers.engine.scheduling.fair_share import FairShare
from gpuworkers.engine.sequence import Request, Sequence, SequenceStatus

BLOCK = 4
_ids = itertools.count()


def make(num_blocks=256, host_blocks=256, policy="fair", **options):
    config = EngineConfig(
        block_size=BLOCK, num_kv_blocks=num_blocks, scheduling_policy=policy, **options
    )
    kv = KVCacheManager(num_blocks, BLOCK, host_blocks, config.enable_prefix_caching, "m")
    return Scheduler(config, kv, max_model_len=4096), kv


def add(scheduler, tier, prompt_len=8, max_tokens=30, priority=0):
    n = next(_ids)
    prompt = [1000 + n * 50 + i for i in range(prompt_len)]  # no prefix sharing
    params = SamplingParams(max_tokens=max_tokens)
    request = Request(f"r{n}", prompt, params, priority, tier)
    seq = Sequence(next(_ids), request, 0, list(prompt), prompt_len)
    request.seqs.append(seq)
    scheduler.add(seq)
    return seq


def tier_name(seq):
    return seq.request.tier or "free"


def fair_tier(seq):
    return seq.request.tier


def fake_step(scheduler, kv):
    """One step; returns tokens scheduled per tier."""
    out = scheduler.schedule()
    tokens = Counter()
    for item in out.seqs:
        tokens[tier_name(scheduler.seqs[item.seq_id])] += item.num_new_tokens
    finish(scheduler, scheduler.on_step_done(out, [7] * len(out.samples)))
    kv.allocator.check_invariants()
    return tokens


def finish(scheduler, emitted):
    for seq, _ in emitted:
        if not seq.is_finished and seq.num_output_tokens >= seq.request.params.max_tokens:
            scheduler.remove(seq)
            seq.status = SequenceStatus.FINISHED


def run_all(scheduler, kv, limit=3000):
    steps = 0
    while scheduler.has_unfinished():
        fake_step(scheduler, kv)
        steps += 1
        assert steps < limit
    assert kv.num_free == kv.num_total
    assert kv.host.num_free == kv.host.num_blocks


def test_token_shares_converge_to_the_weights_under_contention():
    """With all three tiers saturating the worker, each gets its weight's
    fraction of the tokens computed (slots and prefill budget alike)."""
    # No speculation: this fake model's outputs (7, 7, ...) make every
    # n-gram draft right, so the budget the 20 decodes leave would go to
    # drafts (a throughput bonus on spare budget, charged to the tier, not
    # a share of the contended slots) and blur the shares measured here.
    scheduler, kv = make(
        num_blocks=1024, max_num_seqs=20, max_num_batched_tokens=64, speculative_method=None
    )
    for _ in range(60):
        for tier in ("free", "pro", "enterprise"):
            add(scheduler, tier, prompt_len=24, max_tokens=40)
    totals = Counter()
    # Enterprise's queue lasts about 60 / 10 slots * 40 steps: measure
    # while every tier still has work queued.
    for step in range(200):
        tokens = fake_step(scheduler, kv)
        if step >= 20:
            totals += tokens
    assert all(
        any(fair_tier(s) == t for s in scheduler.waiting) for t in ("free", "pro", "enterprise")
    )
    whole = sum(totals.values())
    for tier, weight in (("enterprise", 0.50), ("pro", 0.35), ("free", 0.15)):
        assert abs(totals[tier] / whole - weight) < 0.05, (tier, totals)
    run_all(scheduler, kv)


def test_prefill_budget_is_split_by_deficit():
    """Long prompts make the token budget the bottleneck: each step's budget
    splits by the weights, and none of it is left idle."""
    scheduler, kv = make(num_blocks=4096, max_num_seqs=20, max_num_batched_tokens=64)
    for _ in range(20):
        for tier in ("free", "pro", "enterprise"):
            add(scheduler, tier, prompt_len=200, max_tokens=2)
    totals = Counter()
    for _ in range(100):
        tokens = fake_step(scheduler, kv)
        assert sum(tokens.values()) == 64
        totals += tokens
    for tier, weight in (("enterprise", 0.50), ("pro", 0.35), ("free", 0.15)):
        assert abs(totals[tier] / 6400 - weight) < 0.03, (tier, totals)
    run_all(scheduler, kv)


def test_slot_shares_follow_the_weights_when_slots_are_the_limit():
    """Twenty slots under contention settle near 10 / 7 / 3."""
    scheduler, kv = make(num_blocks=2048, max_num_seqs=20, max_num_batched_tokens=512)
    for _ in range(40):
        for tier in ("free", "pro", "enterprise"):
            add(scheduler, tier, prompt_len=4, max_tokens=200)
    for _ in range(30):
        fake_step(scheduler, kv)
    slots = Counter(tier_name(s) for s in scheduler.running)
    assert abs(slots["enterprise"] - 10) <= 1
    assert abs(slots["pro"] - 7) <= 1
    assert abs(slots["free"] - 3) <= 1
    assert scheduler.num_recomputes == 0


def test_idle_tier_share_is_lent_then_reclaimed_by_swapping_the_newest():
    """Free requests fill every slot while pro is idle; a pro request then
    starts at once, in the place of the newest free sequence, swapped out."""
    scheduler, kv = make(max_num_seqs=4)
    free = [add(scheduler, "free", max_tokens=40) for _ in range(6)]
    for _ in range(3):
        fake_step(scheduler, kv)
    assert [s.status for s in free[:4]] == [SequenceStatus.RUNNING] * 4, "capacity is lent"
    pro = add(scheduler, "pro", max_tokens=5)
    fake_step(scheduler, kv)
    assert pro.status is SequenceStatus.RUNNING
    assert scheduler.swapped == [free[3]], "the newest free sequence makes room"
    assert scheduler.num_swaps_out == 1 and scheduler.num_recomputes == 0
    run_all(scheduler, kv)
    assert all(s.num_output_tokens == 40 for s in free)
    assert scheduler.num_swaps_in == scheduler.num_swaps_out


def test_reclaim_frees_kv_when_the_pool_is_the_limit():
    """Long free reservations fill the KV pool; a pro request still starts
    the next step, and the free work completes later."""
    scheduler, kv = make(num_blocks=40, host_blocks=64, max_num_seqs=16)
    free = [add(scheduler, "free", prompt_len=8, max_tokens=40) for _ in range(8)]
    fake_step(scheduler, kv)
    assert sum(s.status is SequenceStatus.RUNNING for s in free) == 3, "KV is the limit"
    pro = add(scheduler, "pro", prompt_len=8, max_tokens=40)
    fake_step(scheduler, kv)
    assert pro.status is SequenceStatus.RUNNING
    assert scheduler.num_swaps_out >= 1 and scheduler.num_recomputes == 0
    run_all(scheduler, kv)
    assert all(s.num_output_tokens == 40 for s in free + [pro])


def test_recompute_when_the_host_pool_is_full():
    """Without a host pool a reclaimed sequence is recomputed instead."""
    scheduler, kv = make(host_blocks=0, max_num_seqs=2)
    free = [add(scheduler, "free", max_tokens=20) for _ in range(2)]
    fake_step(scheduler, kv)
    pro = add(scheduler, "pro", max_tokens=5)
    fake_step(scheduler, kv)
    assert pro.status is SequenceStatus.RUNNING
    assert scheduler.num_recomputes == 1 and scheduler.num_swaps_out == 0
    run_all(scheduler, kv)
    assert all(s.num_output_tokens == 20 for s in free)


def test_free_tier_keeps_progressing_under_a_paid_flood():
    """Enterprise and pro floods never stop the free tier: it computes
    tokens in every window of 20 steps and finishes while they still queue."""
    scheduler, kv = make(max_num_seqs=6, max_num_batched_tokens=32)
    for _ in range(40):
        add(scheduler, "enterprise", prompt_len=16, max_tokens=30)
        add(scheduler, "pro", prompt_len=16, max_tokens=30)
    free = [add(scheduler, None, prompt_len=16, max_tokens=30) for _ in range(4)]
    window = Counter()
    for step in range(1, 2000):
        window += fake_step(scheduler, kv)
        if step % 20 == 0:
            assert window["free"] > 0, f"free starved in steps {step - 20}-{step}"
            window = Counter()
        if all(s.is_finished for s in free):
            break
    assert all(s.num_output_tokens == 30 for s in free)
    assert scheduler.waiting, "the paid flood was still queued: free was not just last"
    run_all(scheduler, kv)


def test_fcfs_ignores_tiers():
    """Under FCFS a later pro request waits behind the free ones: no
    preemption, admission in arrival order."""
    scheduler, kv = make(max_num_seqs=4, policy="fcfs")
    free = [add(scheduler, "free", max_tokens=10) for _ in range(6)]
    fake_step(scheduler, kv)
    pro = add(scheduler, "pro", max_tokens=5)
    fake_step(scheduler, kv)
    assert pro.status is SequenceStatus.WAITING
    order = []
    while scheduler.has_unfinished():
        out = scheduler.schedule()
        order += [scheduler.seqs[i.seq_id] for i in out.seqs if i.context_len == 0]
        finish(scheduler, scheduler.on_step_done(out, [7] * len(out.samples)))
    assert order == free[4:] + [pro]
    assert scheduler.num_preemptions == 0 and isinstance(scheduler.policy, FCFSPolicy)
    assert kv.num_free == kv.num_total


def test_unknown_tier_counts_as_the_lowest_weight():
    fair = FairShare({"enterprise": 0.5, "pro": 0.35, "free": 0.15}, 8, 64)
    scheduler, _ = make()
    assert fair.tier_of(add(scheduler, None)) == "free"
    assert fair.tier_of(add(scheduler, "platinum")) == "free"
    assert fair.tier_of(add(scheduler, "pro")) == "pro"


def test_credit_is_earned_by_weight_over_active_tiers_and_bounded():
    """Only tiers with work earn credit; it never exceeds one step's budget."""
    fair = FairShare({"enterprise": 0.5, "pro": 0.35, "free": 0.15}, 8, 64)
    fair.refill({"pro", "free"}, 100)
    assert round(fair.credit_of("pro"), 6) == 70.0
    assert round(fair.credit_of("free"), 6) == 30.0
    assert fair.credit_of("enterprise") == 0.0
    for _ in range(10):
        fair.refill({"pro", "free"}, 100)
    assert fair.credit_of("pro") == 100.0
    fair.refill({"free"}, 100)
    assert "pro" not in fair.credit, "an idle tier keeps no credit"


def generate_with_tiers(engine, prompts, arrivals, tiers):
    """Greedy outputs per request, requests joining at the given steps."""
    params = SamplingParams(max_tokens=16, temperature=0.0)
    outputs = {f"r{i}": [] for i in range(len(prompts))}
    step = added = 0
    while added < len(prompts) or engine.has_unfinished_requests():
        while added < len(prompts) and arrivals[added] <= step:
            engine.add_request(f"r{added}", prompts[added], params, tier=tiers[added])
            added += 1
        for out in engine.step():
            outputs[out.request_id].extend(out.choices[0].token_ids if out.choices else [])
        step += 1
        assert step < 2000
    return outputs


def test_fair_share_with_the_model_preempts_and_keeps_greedy_outputs(make_engine, chat_prompts):
    """Free requests fill a small pool; pro and enterprise ones arriving later
    reclaim it by swapping. Every output equals the priority policy's (which
    test_parity checks against transformers), and the pools drain."""
    tiers = ["free"] * 4 + ["pro", "enterprise", "pro", "enterprise"]
    arrivals = [0, 0, 0, 0, 4, 4, 6, 6]
    options = {"num_kv_blocks": 24, "num_host_blocks": 64, "max_num_seqs": 4}
    fair = make_engine(scheduling_policy="fair", **options)
    reference = make_engine(scheduling_policy="priority", **options)
    got = generate_with_tiers(fair, chat_prompts, arrivals, tiers)
    expected = generate_with_tiers(reference, chat_prompts, arrivals, tiers)
    assert got == expected
    stats = fair.stats()
    assert stats["swaps_out"] > 0 and stats["swaps_in"] == stats["swaps_out"]
    assert stats["kv_blocks_used"] == 0
    assert stats["host_blocks_free"] == stats["host_blocks_total"]


def test_growth_preemption_takes_from_the_tier_over_its_share():
    """Under optimistic admission, running sequences outgrow the pool: the
    victims come from the over-share free tier, never from pro, which stays
    under its share (12 of 24 blocks at most, share 0.7)."""
    scheduler, kv = make(num_blocks=24, host_blocks=64, admission_policy="optimistic")
    free = [add(scheduler, "free", prompt_len=8, max_tokens=40) for _ in range(4)]
    pro = [add(scheduler, "pro", prompt_len=8, max_tokens=40)]
    swapped_tiers = set()
    while scheduler.has_unfinished():
        fake_step(scheduler, kv)
        swapped_tiers |= {tier_name(s) for s in scheduler.swapped}
    assert scheduler.num_swaps_out > 0 and scheduler.num_recomputes == 0
    assert swapped_tiers == {"free"}
    assert all(s.num_output_tokens == 40 for s in free + pro)
    assert kv.num_free == kv.num_total and kv.host.num_free == kv.host.num_blocks
