"""Admission control under per-tenant fairness, and service_tier flex.

The worker's heartbeat publishes ``fair_queue`` (gpuworkers' fair_estimate:
per tier, per active tenant and class, what would start before a new
request of that tenant); the wait a request is refused on is the one its
tenant will see, not its whole tier's queue.
"""

from __future__ import annotations

import pytest

from inference.admission import queue_wait as admission
from inference.admission.queue_wait import (
    TYPICAL_OUTPUT_TOKENS,
    FlexCapacityUnavailable,
    QueueWaitExceeded,
    admission_check,
    estimate_wait,
)
from tests.wire.bus.buses import uid
from wire.requests import GenerationRequest, ServiceClass
from wire.sampling import Sampling
from wire.workers import WorkerInfo, WorkerState

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

WEIGHTS = {"enterprise": 0.50, "pro": 0.35, "free": 0.15}
FLOODERS = [str(n) for n in range(1, 7)]
# 64 tokens/s: each request ahead is 256 / 64 = 4 s (prompts cost nothing here).
RATE = 64.0


def flooded(ahead: int = 40, flex_ahead: int | None = None) -> WorkerInfo:
    """Six pro tenants with ``ahead`` requests each queued before their next."""
    entry = {"requests": ahead, "tokens": 0}
    flex = entry if flex_ahead is None else {"requests": flex_ahead, "tokens": 0}
    tenants = {
        t: {"priority": entry, "default": entry, "flex": flex, "running": 16, "level": 1.0}
        for t in FLOODERS
    }
    extra = {
        "max_num_seqs": 96,
        "scheduling_policy": "fair",
        "tier_weights": WEIGHTS,
        "queued_by_tier": {"pro": {"requests": 6 * ahead, "tokens": 0}},
        "fair_queue": {"pro": {"active_tenants": 6, "tenants": tenants}},
    }
    return WorkerInfo(
        worker_id=uid("w"),
        model="m",
        state=WorkerState.READY,
        running=96,
        waiting=6 * ahead,
        tokens_per_second=RATE,
        extra=extra,
    )


def request(tenant: int, cls: ServiceClass = ServiceClass.DEFAULT, tier="pro") -> GenerationRequest:
    return GenerationRequest(
        response_id=uid("resp"),
        model="m",
        prompt_token_ids=[1] * 10,
        sampling=Sampling(),
        tier=tier,
        tenant_id=tenant,
        service_class=cls,
    )


@pytest.fixture(autouse=True)
def _fresh_sla_cache(tiers):
    admission._sla_cache.clear()


async def test_the_estimate_is_what_is_ahead_of_this_tenant_not_its_tier():
    info = flooded(ahead=40)
    light = estimate_wait(info, tier="pro", tenant=7)
    assert (light.seconds, light.requests_ahead) == (0.0, 0)
    flooder = estimate_wait(info, tier="pro", tenant=1)
    assert flooder.requests_ahead == 40
    assert flooder.seconds == pytest.approx(40 * TYPICAL_OUTPUT_TOKENS / (RATE * 1.0))
    # Without a tenant (or a worker without fair_queue): the whole tier's queue.
    assert estimate_wait(info, tier="pro").requests_ahead == 240


async def test_a_light_tenant_is_admitted_while_the_flooding_ones_are_refused():
    info = flooded(ahead=40)
    for flooder in FLOODERS:
        with pytest.raises(QueueWaitExceeded) as refused:
            await admission_check(info, request(int(flooder)))
        assert refused.value.code == "queue_wait_exceeded"
    for _ in range(2):
        assert (await admission_check(info, request(7))).seconds <= 10


async def test_a_tenants_own_requests_since_the_heartbeat_are_ahead_of_it():
    info = flooded(ahead=0)
    first = await admission_check(info, request(7))
    second = await admission_check(info, request(7))
    other = await admission_check(info, request(8))
    assert (first.requests_ahead, second.requests_ahead, other.requests_ahead) == (0, 1, 0)


async def test_flex_is_refused_with_429_when_its_tiers_queue_is_deep(settings):
    """Even a light tenant's flex: flex is served from spare capacity."""
    settings.FLEX_MAX_QUEUE_DEPTH = 32
    info = flooded(ahead=6)  # 36 pro requests queued
    with pytest.raises(FlexCapacityUnavailable) as refused:
        await admission_check(info, request(7, ServiceClass.FLEX))
    error = refused.value
    assert error.status == 429 and error.code == "flex_capacity_unavailable"
    assert int(error.headers["Retry-After"]) >= 1
    assert "service_tier 'default'" in error.message
    # The same tenant's default request is admitted.
    assert (await admission_check(info, request(7))).requests_ahead == 0
    # 36 queued and the default request just sent: 37 deep.
    settings.FLEX_MAX_QUEUE_DEPTH = 38
    flex = await admission_check(info, request(7, ServiceClass.FLEX))
    assert flex.requests_ahead == 1, "only the tenant's own default request is ahead"


async def test_flex_may_wait_longer_than_the_tiers_sla(settings, tiers):
    """Between the SLA and FLEX_QUEUE_WAIT_FACTOR times it: default is
    refused, flex admitted; past that, flex is refused too."""
    settings.FLEX_MAX_QUEUE_DEPTH = 10_000
    settings.FLEX_QUEUE_WAIT_FACTOR = 4.0
    sla = tiers["pro"].queue_sla_seconds
    ahead = (2 * sla) // 4  # twice the SLA, at 4 s per request
    info = flooded(ahead=ahead)
    with pytest.raises(QueueWaitExceeded):
        await admission_check(info, request(1))
    admitted = await admission_check(info, request(1, ServiceClass.FLEX))
    assert sla < admitted.seconds <= 4 * sla
    info = flooded(ahead=ahead, flex_ahead=5 * sla // 4 * 4)
    with pytest.raises(FlexCapacityUnavailable):
        await admission_check(info, request(2, ServiceClass.FLEX))
