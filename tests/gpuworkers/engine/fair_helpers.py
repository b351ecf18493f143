"""Scheduler-level helpers for the fairness tests: tiny pools, no model.

A fake step hands the scheduler a made-up token for every sample the batch
asks for, and finishes sequences at their max_tokens.
"""

from __future__ import annotations

import itertools
from collections import Counter

from gpuworkers.engine.config import EngineConfig
from gpuworkers.engine.kv_manager import KVCacheManager
from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.engine.scheduling import Scheduler
from gpuworkers.engine.sequence import Request, Sequence, SequenceStatus

BLOCK = 16
_ids = itertools.count()


def make(num_blocks=400, host_blocks=400, policy="fair", **options):
    options.setdefault("speculative_method", None)  # fake tokens would make every draft right
    config = EngineConfig(
        block_size=BLOCK, num_kv_blocks=num_blocks, scheduling_policy=policy, **options
    )
    kv = KVCacheManager(num_blocks, BLOCK, host_blocks, config.enable_prefix_caching, "m")
    return Scheduler(config, kv, max_model_len=8192), kv


def add(scheduler, tier, tenant, prompt_len=16, max_tokens=16, service_class="default", at=0.0):
    n = next(_ids)
    prompt = [1000 + n * 3000 + i for i in range(prompt_len)]  # no prefix sharing
    request = Request(
        f"r{n}",
        prompt,
        SamplingParams(max_tokens=max_tokens),
        0,
        tier,
        tenant=tenant,
        service_class=service_class,
    )
    request.arrival_time = at + n * 1e-9
    seq = Sequence(next(_ids), request, 0, list(prompt), prompt_len)
    request.seqs.append(seq)
    scheduler.add(seq)
    return seq


def step(scheduler, kv):
    """One step; returns the output tokens per tenant."""
    out = scheduler.schedule()
    tokens = Counter()
    for seq, _ in scheduler.on_step_done(out, [7] * len(out.samples)):
        tokens[seq.request.tenant] += 1
        if seq.num_output_tokens >= seq.request.params.max_tokens:
            scheduler.remove(seq)
            seq.status = SequenceStatus.FINISHED
    kv.allocator.check_invariants()
    return tokens


def drain(scheduler, kv, limit=5000):
    for _ in range(limit):
        if not scheduler.has_unfinished():
            break
        step(scheduler, kv)
    assert not scheduler.has_unfinished()
    assert kv.num_free == kv.num_total and kv.host.num_free == kv.host.num_blocks


class Flood:
    """Closed-loop tenants: each keeps ``depth`` requests in flight."""

    def __init__(self, scheduler, tier, tenants, depth, prompt_len, max_tokens):
        self.scheduler, self.tier, self.depth = scheduler, tier, depth
        self.shape = (prompt_len, max_tokens)
        self.live: dict[str, list[Sequence]] = {t: [] for t in tenants}

    def top_up(self, now: float) -> None:
        for tenant, live in self.live.items():
            live[:] = [s for s in live if not s.is_finished]
            while len(live) < self.depth:
                live.append(add(self.scheduler, self.tier, tenant, *self.shape, at=now))


def run_floods(scheduler, kv, floods, steps: int, skip: int = 0) -> Counter:
    """``steps`` steps with every flood topped up; the output tokens per
    tenant, counted after the first ``skip`` steps (the ramp)."""
    totals = Counter()
    for now in range(steps):
        for flood in floods:
            flood.top_up(float(now))
        tokens = step(scheduler, kv)
        if now >= skip:
            totals += tokens
    return totals
