"""Fair share between tenants inside a tier, composed with the tier weights,
through the scheduler with tiny pools and no model: equal shares, a light
tenant under a flood, starvation freedom, the progress guarantee.

The fake steps and closed-loop floods are fair_helpers.py's.
"""

from __future__ import annotations

import itertools
from collections import Counter

from gpuworkers.engine.sequence import Sequence, SequenceStatus
from tests.gpuworkers.engine.fair_helpers import Flood, add, drain, make, run_floods, step


def first_token_steps(scheduler, kv, flood, light, steps, every, light_tier="pro"):
    """Run ``steps`` with the flood topped up and a light request every
    ``every`` steps; returns each light request's steps to its first
    token (None: none yet) and the output tokens per tenant."""
    arrived: list[tuple[int, Sequence]] = []
    tokens = Counter()
    first: dict[int, int] = {}
    for now in range(steps):
        flood.top_up(float(now))
        if now % every == every // 2:
            arrived.append((now, add(scheduler, light_tier, light, 24, 8, at=float(now))))
        tokens += step(scheduler, kv)
        for _, seq in arrived:
            if seq.num_output_tokens and seq.seq_id not in first:
                first[seq.seq_id] = now
    waits = [first[s.seq_id] - t if s.seq_id in first else None for t, s in arrived]
    return waits, tokens


def test_tenants_of_a_tier_share_its_tokens_equally_whatever_their_backlog():
    """Three pro tenants keep 24, 8 and 6 requests in flight (each more than
    the 4 of 12 slots that are a third): under the fair policy each gets
    about a third of the output tokens; under FCFS the deepest backlog
    takes the most."""
    shares = {}
    for policy in ("fair", "fcfs"):
        scheduler, kv = make(
            num_blocks=256, max_num_seqs=12, max_num_batched_tokens=128, policy=policy
        )
        floods = [
            Flood(scheduler, "pro", [tenant], depth, 32, 24)
            for tenant, depth in (("deep", 24), ("mid", 8), ("shallow", 6))
        ]
        totals = run_floods(scheduler, kv, floods, 400, skip=50)
        whole = sum(totals.values())
        shares[policy] = {t: totals[t] / whole for t in ("deep", "mid", "shallow")}
    for share in shares["fair"].values():
        assert abs(share - 1 / 3) < 0.04, shares["fair"]
    assert shares["fcfs"]["deep"] > 0.5 and shares["fcfs"]["shallow"] < 0.25, shares["fcfs"]


def test_tier_weights_hold_between_tiers_and_tenants_are_equal_inside():
    """Pro (three tenants) and free (two) all flooding: the tiers split the
    tokens 0.7 / 0.3 by weight, and inside each tier the tenants equally."""
    scheduler, kv = make(num_blocks=1024, max_num_seqs=20, max_num_batched_tokens=64)
    floods = [
        Flood(scheduler, "pro", ["p1", "p2", "p3"], 10, 24, 40),
        Flood(scheduler, "free", ["f1", "f2"], 10, 24, 40),
    ]
    totals = run_floods(scheduler, kv, floods, 400, skip=40)
    whole = sum(totals.values())
    pro = sum(totals[t] for t in ("p1", "p2", "p3"))
    assert abs(pro / whole - 0.7) < 0.04, totals
    for tenant in ("p1", "p2", "p3"):
        assert abs(totals[tenant] / pro - 1 / 3) < 0.05, totals
    for tenant in ("f1", "f2"):
        assert abs(totals[tenant] / (whole - pro) - 1 / 2) < 0.06, totals


def test_a_light_tenant_is_served_at_once_under_a_flood_past_the_kv_pool():
    """Six pro tenants keep 16 long prompts each in flight (the pool holds
    four); a seventh sends a short request every 10 steps. Fair: each is
    computing within 2 steps of arriving, and the six share the rest
    equally. FCFS: none of them gets a token in 300 steps."""
    results = {}
    for policy in ("fair", "fcfs"):
        scheduler, kv = make(max_num_seqs=64, max_num_batched_tokens=512, policy=policy)
        flood = Flood(scheduler, "pro", [f"f{i}" for i in range(6)], 16, 1300, 64)
        results[policy] = first_token_steps(scheduler, kv, flood, "light", 300, 10)
    waits, tokens = results["fair"]
    assert all(w is not None and w <= 2 for w in waits), waits
    flooded = [tokens[f"f{i}"] for i in range(6)]
    assert max(flooded) - min(flooded) <= 64, tokens  # one request's outputs apart
    fcfs_waits, _ = results["fcfs"]
    assert all(w is None for w in fcfs_waits), fcfs_waits


def test_a_light_enterprise_tenant_is_served_at_once_under_a_pro_flood():
    scheduler, kv = make(max_num_seqs=64, max_num_batched_tokens=512)
    flood = Flood(scheduler, "pro", [f"f{i}" for i in range(6)], 16, 1300, 64)
    waits, _ = first_token_steps(scheduler, kv, flood, "light", 200, 10, light_tier="enterprise")
    assert all(w is not None and w <= 1 for w in waits), waits


def starts_under_adversarial_flood(policy: str):
    """Steps at which each tenant's sequences started, and the rare
    tenant's arrival steps: two tenants flood with short requests 40 deep,
    two keep long prompts queued (a quarter of the pool each, with
    reservations), a fifth arrives every 97 steps."""
    scheduler, kv = make(
        num_blocks=160,
        max_num_seqs=16,
        max_num_batched_tokens=256,
        fair_counter_slack=512,
        policy=policy,
    )
    floods = [
        Flood(scheduler, "pro", ["small1", "small2"], 40, 16, 8),
        Flood(scheduler, "pro", ["long1", "long2"], 4, 700, 32),
    ]
    started: dict[str, list[int]] = {}
    seen: set[int] = set()
    arrivals = []
    for now in range(1500):
        for flood in floods:
            flood.top_up(float(now))
        if now % 97 == 13:
            arrivals.append(now)
            add(scheduler, "pro", "rare", 200, 16, at=float(now))
        step(scheduler, kv)
        for seq in scheduler.running:
            if seq.seq_id not in seen:
                seen.add(seq.seq_id)
                started.setdefault(seq.request.tenant, []).append(now)
    return started, arrivals


def test_every_tenant_is_served_within_a_bounded_number_of_steps():
    """Starvation freedom under an adversarial flood: a backlogged tenant
    starts a request at least every ``bound`` steps, and the rare tenant's
    request starts within ``bound`` of arriving. The bound covers the
    bypass slack's worth of small requests and the running ones' remaining
    lifetimes (32 outputs + 3 chunks of a long prompt); it does not grow
    with the flood's depth. FCFS makes the rare tenant wait behind the
    whole flood, past the bound."""
    bound = 45
    started, arrivals = starts_under_adversarial_flood("fair")
    for tenant in ("small1", "small2", "long1", "long2"):
        gaps = [b - a for a, b in itertools.pairwise(started[tenant])]
        assert len(started[tenant]) > 40 and max(gaps) <= bound, (tenant, max(gaps))
    waits = [s - a for s, a in zip(started["rare"], arrivals, strict=True)]
    assert max(waits) <= bound, waits
    started, arrivals = starts_under_adversarial_flood("fcfs")
    waits = [s - a for s, a in zip(started["rare"], arrivals, strict=False)]
    assert min(waits) > bound, waits


def steps_from_resume_to_preemption(guard: int) -> list[int]:
    """Bursts of pro and enterprise requests keep reclaiming the capacity
    lent to a free flood, so sequences are swapped out, back in and out
    again: the steps from each resume to the next preemption."""
    scheduler, kv = make(num_blocks=64, host_blocks=256, max_num_seqs=6, preempt_min_steps=guard)
    flood = Flood(scheduler, "free", ["x", "y"], 6, 40, 60)
    resumed: dict[int, int] = {}
    gaps = []
    before: dict[int, SequenceStatus] = {}
    for now in range(600):
        flood.top_up(float(now))
        if now % 25 in (0, 12):
            tier = "enterprise" if now % 50 < 25 else "pro"
            for _ in range(3):
                add(scheduler, tier, "burst", 40, 6, at=float(now))
        step(scheduler, kv)
        states = {s.seq_id: s.status for s in scheduler.seqs.values()}
        for seq_id, state in states.items():
            was = before.get(seq_id)
            if was is SequenceStatus.SWAPPED and state is SequenceStatus.RUNNING:
                resumed[seq_id] = now
            left = was is SequenceStatus.RUNNING and state is not SequenceStatus.RUNNING
            if left and seq_id in resumed:
                gaps.append(now - resumed[seq_id])
        before = states
    drain(scheduler, kv)
    return gaps


def test_no_sequence_is_preempted_twice_within_its_progress_guarantee():
    """Resumed sequences are preempted again, but never within
    ``preempt_min_steps`` steps of coming back (preempted at the start of
    step t + k, it ran steps t + 1 .. t + k - 1 after resuming in step t);
    without the guarantee the same bursts take some sooner."""
    gaps = steps_from_resume_to_preemption(guard=6)
    assert len(gaps) >= 10 and min(gaps) >= 6, gaps
    assert min(steps_from_resume_to_preemption(guard=0)) < 6


def test_a_claim_waits_for_a_resumed_victims_guarantee():
    """A batch sequence is swapped out for an interactive request and comes
    back when it is done; a second interactive request then waits out the
    batch sequence's guarantee before taking its place (at once without a
    guarantee)."""
    for guard, expected_wait in ((3, 3), (0, 1)):
        scheduler, kv = make(num_blocks=64, host_blocks=64, max_num_seqs=1, preempt_min_steps=guard)
        batch = add(scheduler, "pro", "x", 16, 40, service_class="batch")
        step(scheduler, kv)
        add(scheduler, "pro", "y", 16, 2)
        step(scheduler, kv)
        assert batch.status is SequenceStatus.SWAPPED
        while batch.status is not SequenceStatus.RUNNING:
            step(scheduler, kv)
        assert batch.preempt_guard == guard
        second = add(scheduler, "pro", "y", 16, 2)
        waited = 0
        while second.status is not SequenceStatus.RUNNING:
            step(scheduler, kv)
            waited += 1
            assert waited < 10
        assert waited == expected_wait and batch.status is SequenceStatus.SWAPPED
        drain(scheduler, kv)
