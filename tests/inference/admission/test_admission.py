"""Admission control: the wait estimate from a heartbeat, and the 429 refusal."""

from __future__ import annotations

import math

import pytest

from inference.admission import queue_wait as admission
from inference.admission.queue_wait import (
    PREFILL_COST,
    TYPICAL_OUTPUT_TOKENS,
    QueueWaitExceeded,
    admission_check,
    estimate_wait,
)
from inference.relay.dispatch import dispatch_request
from tests.wire.bus.buses import make_buses, uid
from wire.requests import GenerationRequest
from wire.sampling import Sampling
from wire.workers import WorkerInfo, WorkerState

WEIGHTS = {"enterprise": 0.50, "pro": 0.35, "free": 0.15}


def worker(model="m", fair_queue=None, capacity=8, **load) -> WorkerInfo:
    """A heartbeat; by default every one of its ``capacity`` slots is busy."""
    load.setdefault("running", capacity)
    extra = {"max_num_seqs": capacity}
    if fair_queue is not None:
        extra |= {
            "scheduling_policy": "fair",
            "tier_weights": WEIGHTS,
            "queued_by_tier": fair_queue,
        }
    return WorkerInfo(worker_id=uid("w"), model=model, state=WorkerState.READY, extra=extra, **load)


def request(tier: str, model="m", prompt=10) -> GenerationRequest:
    return GenerationRequest(
        response_id=uid("resp"),
        model=model,
        prompt_token_ids=[1] * prompt,
        sampling=Sampling(),
        tier=tier,
    )


def test_an_idle_worker_means_no_wait():
    assert estimate_wait(worker(running=3, tokens_per_second=50.0), tier="pro").seconds == 0.0


def test_a_queue_that_fits_the_free_slots_means_no_wait():
    """Requests waiting only for the next engine step are not a queue."""
    info = worker(running=3, waiting=4, queued_tokens=800, tokens_per_second=5.0)
    assert estimate_wait(info, tier="free").seconds == 0.0
    info = worker(running=3, waiting=5, queued_tokens=800, tokens_per_second=5.0)
    assert estimate_wait(info, tier="free").seconds > 0.0


def test_no_measured_rate_refuses_nothing():
    """A fresh worker (no rate yet) estimates zero, however long its queue."""
    estimate = estimate_wait(worker(waiting=40, queued_tokens=9000), tier="free")
    assert estimate.seconds == 0.0 and estimate.requests_ahead == 40


def test_fifo_wait_counts_every_queued_request_and_prompt():
    """Without fair share, everything queued is ahead, at the full rate."""
    info = worker(waiting=3, swapped=1, queued_tokens=1000, tokens_per_second=100.0)
    estimate = estimate_wait(info, tier="enterprise")
    expected = (4 * TYPICAL_OUTPUT_TOKENS + 1000 * PREFILL_COST) / 100.0
    assert estimate.seconds == pytest.approx(expected)
    assert estimate.requests_ahead == 4 and estimate.share == 1.0


def test_a_full_kv_cache_puts_a_new_request_behind_one_finishing():
    info = worker(running=2, kv_blocks_used=99, kv_blocks_total=100, tokens_per_second=128.0)
    assert estimate_wait(info, tier="pro").seconds == pytest.approx(TYPICAL_OUTPUT_TOKENS / 128.0)


def test_fair_share_counts_only_the_tiers_own_queue_at_its_share():
    """A free flood does not delay pro; pro's own queue drains at pro's share."""
    flood = {"free": {"requests": 200, "tokens": 40000}}
    info = worker(fair_queue=flood, waiting=200, queued_tokens=40000, tokens_per_second=100.0)
    assert estimate_wait(info, tier="pro").seconds == 0.0
    free = estimate_wait(info, tier="free")
    assert free.share == 1.0 and free.requests_ahead == 200
    both = {**flood, "pro": {"requests": 2, "tokens": 100}}
    info = worker(fair_queue=both, waiting=202, tokens_per_second=100.0)
    pro = estimate_wait(info, tier="pro")
    assert pro.share == pytest.approx(0.35 / 0.50)
    expected = (2 * TYPICAL_OUTPUT_TOKENS + 100 * PREFILL_COST) / (100.0 * 0.7)
    assert pro.seconds == pytest.approx(expected)


def test_unknown_tier_counts_as_the_lowest_weight_under_fair_share():
    info = worker(fair_queue={"free": {"requests": 5, "tokens": 0}}, tokens_per_second=10.0)
    assert estimate_wait(info, tier="mystery").requests_ahead == 5


def test_requests_sent_since_the_heartbeat_count():
    info = worker(fair_queue={}, tokens_per_second=100.0)
    estimate = estimate_wait(info, tier="pro", pending={"pro": (3, 30), "free": (9, 9)})
    assert estimate.requests_ahead == 3


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_admission_check_refuses_past_the_tier_sla_with_retry_after(tiers):
    """Enough free requests ahead to wait 10 s past free's SLA is a 429
    whose Retry-After covers the excess; pro, with its queue empty, is
    admitted and counted as pending until the next heartbeat."""
    admission._sla_cache.clear()
    sla = tiers["free"].queue_sla_seconds
    ahead = (sla + 10) // 4  # each takes 256 / 64 = 4 s
    info = worker(fair_queue={"free": {"requests": ahead, "tokens": 0}}, tokens_per_second=64.0)
    with pytest.raises(QueueWaitExceeded) as refused:
        await admission_check(info, request("free"))
    error = refused.value
    assert error.status == 429 and error.code == "queue_wait_exceeded"
    assert error.estimate.seconds == pytest.approx(ahead * TYPICAL_OUTPUT_TOKENS / 64.0)
    assert int(error.headers["Retry-After"]) == math.ceil(error.estimate.seconds - sla)
    assert int(error.headers["retry-after-ms"]) > 0
    accepted = await admission_check(info, request("pro"))
    assert accepted.seconds == 0.0
    again = await admission_check(info, request("pro"))
    assert again.requests_ahead == 1, "the first pro request is now ahead"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_dispatch_refuses_before_enqueueing(tiers, settings):
    """An over-SLA request never reaches the worker's queue."""
    settings.EMBEDDED_ENGINE = False
    admission._sla_cache.clear()
    bus, worker_bus = make_buses("memory")
    model = uid("model")
    info = worker(
        model,
        fair_queue={"free": {"requests": 50, "tokens": 0}},
        waiting=50,
        tokens_per_second=20.0,
    )
    worker_bus.register(info)
    with pytest.raises(QueueWaitExceeded):
        await dispatch_request(request("free", model=model), bus=bus)
    requests, _ = worker_bus.poll(info.worker_id, 10)
    assert requests == []
    chosen = await dispatch_request(request("enterprise", model=model), bus=bus)
    assert chosen.worker_id == info.worker_id
    await bus.close()
