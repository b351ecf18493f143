"""Where a new request would stand in the fair order: for admission control.

Published in the engine's stats (``fair_queue``) for the web tier to
estimate a request's wait from what is ahead of *it*, not from its whole
tier's queue. Per tier, for each active tenant (queued or running work)
and each interactive class: the requests and prompt tokens that would
start before a new request of that tenant and class.

Inside a tier the next to start is the head of the tenant with the lowest
counter (fair_policy.py). A new request of tenant T, class C, comes after
T's own queued requests of class C or higher (and its swapped ones); by
then T's counter has grown by their prompt tokens, to ``target``. Another
tenant's k-th queued request starts before it if that tenant's counter,
plus its first k - 1 requests' prompts, is still below ``target``. A
tenant absent from the map starts at the floor, below everyone's next
request: nothing of its tier is ahead of it (it waits only for room).

An estimate: it charges prompts only (outputs are charged as they are
generated, which moves running tenants up over time) and ignores arrivals
to come. Tiers are separate queues (their shares split the service rate).
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate
from typing import TYPE_CHECKING

from gpuworkers.engine.scheduling.capacity import seats
from gpuworkers.engine.scheduling.policy import Queues
from gpuworkers.engine.scheduling.tenant_counters import TenantKey
from gpuworkers.engine.sequence import Sequence, SequenceStatus, ServiceClass

if TYPE_CHECKING:
    from gpuworkers.engine.scheduling.fair_policy import FairPolicy

INTERACTIVE = (ServiceClass.PRIORITY, ServiceClass.DEFAULT, ServiceClass.FLEX)


def queue_positions(policy: FairPolicy, queues: Queues) -> dict[str, dict]:
    """``{tier: {"active_tenants": n, "tenants": {tenant: {class: {"requests",
    "tokens"}, "running": n, "level": usage over share}}}}``."""
    queued: dict[TenantKey, list[Sequence]] = {}
    for seq in sorted(queues.swapped + queues.waiting, key=policy.queue_key):
        if not seq.request.is_batch:
            queued.setdefault(policy.key_of(seq), []).append(seq)
    running = policy.interactive(queues.running)
    running_keys = {policy.key_of(s) for s in running}
    tiers: dict[str, set[TenantKey]] = {}
    for key in running_keys | set(queued):
        tiers.setdefault(key[0], set()).add(key)
    weights = policy.share.weights
    total = sum(weights[t] for t in tiers) or 1.0
    usage = policy.usage_by_tenant(running)
    out: dict[str, dict] = {}
    for tier in sorted(tiers):
        keys = sorted(tiers[tier])
        share = weights[tier] / total / len(keys)
        counters = _counters(policy, tier, keys)
        prefixes = {
            k: list(accumulate((s.num_uncomputed_tokens for s in queued[k]), initial=0))
            for k in keys
            if k in queued
        }
        tenants = {}
        for key in keys:
            entry: dict = {
                cls.value: _ahead(policy, key, cls, queued.get(key, []), counters, prefixes)
                for cls in INTERACTIVE
            }
            entry["running"] = sum(seats(s) for s in running if policy.key_of(s) == key)
            entry["level"] = round(usage.get(key, 0.0) / share, 3)
            tenants[key[1]] = entry
        out[tier] = {"active_tenants": len(keys), "tenants": tenants}
    return out


def _counters(policy: FairPolicy, tier: str, keys: list[TenantKey]) -> dict[TenantKey, float]:
    """Each tenant's counter as the next step will see it (newcomers lifted)."""
    counters = policy.counters
    floor = counters.floor(tier)
    known = counters.active.get(tier, frozenset())
    return {
        k: counters.counter(tier, k) if k in known else max(counters.counter(tier, k), floor)
        for k in keys
    }


def _ahead(
    policy: FairPolicy,
    key: TenantKey,
    cls: ServiceClass,
    own: list[Sequence],
    counters: dict[TenantKey, float],
    prefixes: dict[TenantKey, list[int]],
) -> dict[str, int]:
    """Requests and prompt tokens ahead of a new ``cls`` request of ``key``."""
    mine = [
        s
        for s in own
        if s.status is SequenceStatus.SWAPPED or s.request.service_class.rank <= cls.rank
    ]
    requests = len(mine)
    tokens = sum(s.num_uncomputed_tokens for s in mine)
    weight = policy.counters.prompt_weight
    target = counters[key] + weight * tokens
    for other, prefix in prefixes.items():
        if other == key:
            continue
        gap = target - counters[other]
        if weight > 0:
            # Requests whose start leaves the other's counter below target.
            count = bisect_left(prefix, gap / weight, 0, len(prefix) - 1)
        else:
            count = len(prefix) - 1 if gap > 0 else 0
        requests += count
        tokens += prefix[count]
    return {"requests": requests, "tokens": tokens}
