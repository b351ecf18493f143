"""Admission control: refuse up front a request that would wait past its SLA.

Before a request is handed to the chosen worker, its wait to be scheduled
is estimated from that worker's last heartbeat. Over the tier's
``queue_sla_seconds`` it is refused with a 429 and a ``Retry-After``,
instead of sitting in the queue until it times out.

The estimate is deliberately simple. A queued request starts when a running
one finishes and frees its slot; slots free up at the worker's generation
rate divided by a typical output length, so ``k`` requests ahead take about
``k * TYPICAL_OUTPUT_TOKENS / tokens_per_second`` seconds, plus their
prompts, which cost a fraction of a generated token each (batched prefill).
Under fair-share scheduling only the request's own tier's queue is ahead of
it, and that tier can count on its weight's fraction of the rate; an idle
tier's request starts at once (the engine reclaims capacity lent to others).
A worker that can start everything it has queued (free slots, KV to
spare) means no wait, and so does one without a measured rate (a fresh
worker): nothing is refused without evidence of a real queue.

Under the engine's per-tenant fairness (``fair_queue`` in the worker's
stats: for each active tenant of a tier and each service class, the
requests and prompt tokens that would start before a new request of that
tenant and class) only what is ahead of *this tenant* counts, plus what
the tenant itself sent since the heartbeat: a light tenant is admitted
while the tenants flooding its tier wait behind their own queues and are
refused. A tenant the worker has nothing of starts at the floor of the
fair order, ahead of every flooder's next request.

``service_tier`` "flex" may wait longer (FLEX_QUEUE_WAIT_FACTOR times the
tier's SLA) but is the first refused when capacity is short: with the
tier's queue on the worker FLEX_MAX_QUEUE_DEPTH deep or more, a flex
request gets 429 ``flex_capacity_unavailable`` with a Retry-After.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from inference.errors import RateLimited
from wire.requests import GenerationRequest, ServiceClass
from wire.workers import WorkerInfo

# Output length assumed for queued requests (the heartbeat has no max_tokens).
TYPICAL_OUTPUT_TOKENS = 256
# A prompt token's cost relative to a generated token.
PREFILL_COST = 0.1
# A worker whose KV cache is this full starts nothing new until a slot frees.
KV_NEARLY_FULL = 0.95
# Tier SLAs are read from the database at most this often per process.
SLA_CACHE_SECONDS = 60.0
DEFAULT_TIER_WEIGHTS = {"enterprise": 0.50, "pro": 0.35, "free": 0.15}


@dataclass(slots=True, frozen=True)
class WaitEstimate:
    seconds: float
    # Requests that must start before this one.
    requests_ahead: int
    # Fraction of the worker's generation rate this request's tier gets.
    share: float


class QueueWaitExceeded(RateLimited):
    code = "queue_wait_exceeded"

    def __init__(self, estimate: WaitEstimate, sla_seconds: float):
        super().__init__(
            f"The server is busy: the estimated wait of {estimate.seconds:.0f}s exceeds"
            f" your tier's limit of {sla_seconds:.0f}s. Please retry after the time in"
            " the Retry-After header.",
            retry_after=max(1.0, estimate.seconds - sla_seconds),
        )
        self.estimate = estimate


class FlexCapacityUnavailable(QueueWaitExceeded):
    """A flex request when the queue is deep: flex is served from spare
    capacity and is the first to be turned away (OpenAI's 429 for flex)."""

    code = "flex_capacity_unavailable"

    def __init__(self, estimate: WaitEstimate, *, depth: int, retry_after: float):
        RateLimited.__init__(
            self,
            f"Flex capacity is unavailable right now ({depth} requests queued ahead of"
            " this tier's flex work). Please retry after the time in the Retry-After"
            " header, or use service_tier 'default'.",
            retry_after=max(1.0, retry_after),
        )
        self.estimate = estimate


def estimate_wait(
    info: WorkerInfo,
    *,
    tier: str,
    pending: dict[str, tuple[int, int]] | None = None,
    tenant: int | None = None,
    service_class: str = ServiceClass.DEFAULT,
    own_pending: tuple[int, int] = (0, 0),
) -> WaitEstimate:
    """Seconds before a new ``tier`` request on ``info``'s worker is scheduled.

    ``pending``: per tier, (requests, prompt tokens) sent to the worker
    since its heartbeat, which the heartbeat does not show yet. With
    ``tenant`` and a worker publishing ``fair_queue``, the wait is the one
    this tenant's ``service_class`` request will see in the fair order;
    ``own_pending`` is then what this tenant sent since the heartbeat.
    """
    pending = pending or {}
    stats: dict[str, Any] = info.extra or {}
    if not _saturated(info, stats, pending):
        # Everything queued fits and starts with the next engine step.
        return WaitEstimate(0.0, 0, 1.0)
    queued = stats.get("queued_by_tier")
    if stats.get("scheduling_policy") == "fair" and isinstance(queued, dict):
        weights = stats.get("tier_weights") or DEFAULT_TIER_WEIGHTS
        own = tier if tier in weights else min(weights, key=weights.__getitem__)
        ahead = _ahead_of_tenant(stats, own, tenant, service_class)
        if ahead is not None:
            requests = ahead[0] + own_pending[0]
            tokens = ahead[1] + own_pending[1]
        else:
            mine = queued.get(own) or {}
            sent = pending.get(own, (0, 0))
            requests = mine.get("requests", 0) + sent[0]
            tokens = mine.get("tokens", 0) + sent[1]
        active = {t for t, q in queued.items() if q.get("requests")} | {own}
        share = weights[own] / (sum(weights.get(t, 0.0) for t in active) or 1.0)
    else:
        requests = info.waiting + info.swapped + sum(n for n, _ in pending.values())
        tokens = info.queued_tokens + sum(t for _, t in pending.values())
        requests += 1 if info.kv_usage >= KV_NEARLY_FULL else 0
        share = 1.0
    rate = info.tokens_per_second * share
    if requests <= 0 or rate <= 0:
        return WaitEstimate(0.0, max(requests, 0), share)
    work = requests * TYPICAL_OUTPUT_TOKENS + tokens * PREFILL_COST
    return WaitEstimate(work / rate, requests, share)


def _ahead_of_tenant(
    stats: dict[str, Any], tier: str, tenant: int | None, service_class: str
) -> tuple[int, int] | None:
    """(requests, prompt tokens) ahead of a new request of ``tenant`` in the
    worker's fair order; None when the worker publishes no fair order."""
    fair = stats.get("fair_queue")
    if tenant is None or not isinstance(fair, dict):
        return None
    entry = ((fair.get(tier) or {}).get("tenants") or {}).get(str(tenant))
    if not isinstance(entry, dict):
        # Nothing of this tenant on the worker: it starts at the floor of
        # the fair order, ahead of every other tenant's next request.
        return (0, 0)
    ahead = entry.get(service_class) or entry.get(ServiceClass.DEFAULT) or {}
    return (int(ahead.get("requests", 0)), int(ahead.get("tokens", 0)))


def tier_queue_depth(
    info: WorkerInfo, *, tier: str, pending: dict[str, tuple[int, int]] | None = None
) -> int:
    """Interactive requests of ``tier`` queued on the worker (all of them
    without per-tier stats), counting those sent since its heartbeat."""
    pending = pending or {}
    stats: dict[str, Any] = info.extra or {}
    queued = stats.get("queued_by_tier")
    if isinstance(queued, dict):
        return int((queued.get(tier) or {}).get("requests", 0)) + pending.get(tier, (0, 0))[0]
    return info.waiting + info.swapped + sum(n for n, _ in pending.values())


def _saturated(info: WorkerInfo, stats: dict[str, Any], pending) -> bool:
    """The worker cannot start everything it has queued right away."""
    if info.kv_usage >= KV_NEARLY_FULL or info.swapped:
        return True
    capacity = stats.get("max_num_seqs")
    sent = sum(n for n, _ in pending.values())
    return bool(capacity) and info.running + info.waiting + sent >= capacity


# worker_id -> (heartbeat_at, {tier: [requests, prompt tokens]},
# {(tier, tenant): [requests, prompt tokens]}) sent since.
_pending: dict[
    str, tuple[float, dict[str, list[int]], dict[tuple[str, int | None], list[int]]]
] = {}
# tier name -> (read at, queue_sla_seconds or None for an unknown tier).
_sla_cache: dict[str, tuple[float, float | None]] = {}


def _pending_for(
    info: WorkerInfo,
) -> tuple[dict[str, list[int]], dict[tuple[str, int | None], list[int]]]:
    seen = _pending.get(info.worker_id)
    if seen is None or seen[0] != info.heartbeat_at:
        seen = _pending[info.worker_id] = (info.heartbeat_at, {}, {})
    return seen[1], seen[2]


async def tier_queue_sla(name: str) -> float | None:
    """The tier's ``queue_sla_seconds`` (None for an unknown tier), cached."""
    from fleet.snapshot import asnapshot_current

    snapshot = await asnapshot_current()
    if snapshot is not None and name in snapshot.tiers:
        # The control snapshot: no query on the request path.
        return float(snapshot.tiers[name].queue_sla_seconds)
    now = time.monotonic()
    hit = _sla_cache.get(name)
    if hit is not None and now - hit[0] < SLA_CACHE_SECONDS:
        return hit[1]
    from tenants.models import Tier

    value = (
        await Tier.objects.filter(name=name).values_list("queue_sla_seconds", flat=True).afirst()
    )
    sla = float(value) if value is not None else None
    _sla_cache[name] = (now, sla)
    return sla


async def admission_check(info: WorkerInfo, request: GenerationRequest) -> WaitEstimate:
    """Refuse ``request`` (QueueWaitExceeded, a 429) if its estimated wait on
    ``info``'s worker exceeds its tier's SLA (flex: FlexCapacityUnavailable,
    see the module); otherwise count it as pending there until the worker's
    next heartbeat."""
    pending, by_tenant = _pending_for(info)
    snapshot = {tier: (n, t) for tier, (n, t) in pending.items()}
    own_key = (request.tier, request.tenant_id)
    own = by_tenant.get(own_key, [0, 0])
    service_class = request.service_class
    estimate = estimate_wait(
        info,
        tier=request.tier,
        pending=snapshot,
        tenant=request.tenant_id,
        service_class=service_class.value,
        own_pending=(own[0], own[1]),
    )
    flex = service_class is ServiceClass.FLEX
    if flex:
        depth = tier_queue_depth(info, tier=request.tier, pending=snapshot)
        if depth >= settings.FLEX_MAX_QUEUE_DEPTH:
            tier_wide = estimate_wait(info, tier=request.tier, pending=snapshot)
            raise FlexCapacityUnavailable(estimate, depth=depth, retry_after=tier_wide.seconds)
    if estimate.seconds > 0:
        sla = await tier_queue_sla(request.tier)
        if sla is not None and flex:
            sla *= settings.FLEX_QUEUE_WAIT_FACTOR
            if estimate.seconds > sla:
                raise FlexCapacityUnavailable(
                    estimate, depth=estimate.requests_ahead, retry_after=estimate.seconds - sla
                )
        if sla is not None and estimate.seconds > sla:
            raise QueueWaitExceeded(estimate, sla)
    tokens = len(request.prompt_token_ids)
    for sent in (pending.setdefault(request.tier, [0, 0]), by_tenant.setdefault(own_key, own)):
        sent[0] += 1
        sent[1] += tokens
    return estimate
