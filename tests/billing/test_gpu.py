"""GPU accounting: samples from worker counters, and the cost report over a recorded run."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import GpuUsageSample, UsageRecord
from billing.selectors.reports import gpu_cost_report, gpu_cost_totals
from billing.services import gpu_usage_sample
from inference.relay.dispatch import cancel_request, dispatch_request, stream_events
from tests.helpers import wait_until
from tests.plugins.engine import MODEL
from tests.usage_records import record_usage
from tests.wire.bus.buses import make_buses, uid
from wire.events import Terminal
from wire.requests import GenerationRequest
from wire.sampling import Sampling
from wire.workers import WorkerInfo, WorkerState

pytestmark = pytest.mark.django_db
DAY = date(2025, 6, 1)
NOON = datetime(2025, 6, 1, 12, tzinfo=UTC)


def info(worker_id: str, boot_id: str, busy: float, idle: float, price="3.20") -> WorkerInfo:
    extra = {"boot_id": boot_id, "busy_seconds": busy, "idle_seconds": idle, "hourly_price": price}
    return WorkerInfo(worker_id=worker_id, model=MODEL, state=WorkerState.READY, extra=extra)


def samples(worker_id: str) -> list[tuple[float, float]]:
    rows = GpuUsageSample.objects.filter(worker_id=worker_id).order_by("sampled_at", "id")
    return [(s.busy_seconds, s.idle_seconds) for s in rows]


def test_samples_are_deltas_of_the_counters_across_reruns_and_restarts():
    """A rerun on the same heartbeat records nothing; a restart (new boot id) counts from
    zero; an older heartbeat arriving late is ignored."""
    assert gpu_usage_sample(workers=[info("w1", "boot-a", 10.0, 5.0)], now=NOON) == 1
    assert gpu_usage_sample(workers=[info("w1", "boot-a", 10.0, 5.0)], now=NOON) == 0
    assert gpu_usage_sample(workers=[info("w1", "boot-a", 16.5, 9.0)], now=NOON) == 1
    assert gpu_usage_sample(workers=[info("w1", "boot-a", 12.0, 7.0)], now=NOON) == 0
    assert gpu_usage_sample(workers=[info("w1", "boot-b", 1.0, 2.0)], now=NOON) == 1
    # A worker without counters (an older build) is skipped, not an error.
    legacy = WorkerInfo(worker_id="w2", model=MODEL, state=WorkerState.READY)
    assert gpu_usage_sample(workers=[legacy], now=NOON) == 0
    assert samples("w1") == [(10.0, 5.0), (6.5, 4.0), (1.0, 2.0)]


def test_report_prices_gpu_time_and_divides_by_useful_tokens(tenant_factory):
    """Cost = (busy + idle) hours x price, per worker price; useful = completed tokens;
    failed and cancelled tokens are lost; idle share = idle / (busy + idle)."""
    gpu_usage_sample(workers=[info("a", "1", 3000.0, 600.0, price="2.00")], now=NOON)
    gpu_usage_sample(workers=[info("b", "1", 1800.0, 1800.0, price="4.00")], now=NOON)
    tenant = tenant_factory()
    for status, prompt, completion in [
        ("completed", 400_000, 600_000),
        ("completed", 0, 1_000_000),
        ("failed", 1000, 234),
        ("cancelled", 500, 100),
        ("incomplete", 77, 7),
    ]:
        UsageRecord.objects.create(
            response_id=uid("resp"),
            tenant=tenant,
            model=MODEL,
            source="api",
            status=status,
            prompt_tokens=prompt,
            completion_tokens=completion,
            created_at=NOON,
        )

    (row,) = gpu_cost_report(start=DAY, end=DAY)

    assert row.gpu_cost == Decimal("2.00") + Decimal("4.00")  # one hour each
    assert row.idle_share == Decimal(2400) / Decimal(7200)
    assert (row.useful_tokens, row.completed_responses) == (2_000_000, 2)
    assert row.cost_per_million_useful == Decimal("3.00")
    assert (row.lost_tokens, row.failed_responses, row.cancelled_responses) == (1834, 1, 1)
    assert gpu_cost_totals([row])[0].gpu_cost == row.gpu_cost


def test_report_progress_and_empty_days():
    """on_progress sees every day; days without samples or usage have no rows."""
    seen = []
    assert (
        gpu_cost_report(start=DAY, end=date(2025, 6, 3), on_progress=lambda *a: seen.append(a))
        == []
    )
    assert seen == [(1, 3), (2, 3), (3, 3)]


async def _run_requests(bus, prompts: list[list[int]]) -> list[tuple[str, Terminal]]:
    """Two completed responses and one cancelled after its first delta: each
    response's id and its ending."""
    terminals = []
    for index, prompt in enumerate(prompts):
        request = GenerationRequest(
            response_id=uid("resp"),
            model=MODEL,
            prompt_token_ids=prompt,
            sampling=Sampling(max_tokens=64 if index == 2 else 12, temperature=0.0),
        )
        worker = await dispatch_request(request, bus=bus)
        async for event in stream_events(request.response_id, worker_id=worker.worker_id, bus=bus):
            if index == 2 and event.type == "delta":
                await cancel_request(request.response_id, worker_id=worker.worker_id, bus=bus)
            if isinstance(event, Terminal):
                terminals.append((request.response_id, event))
    return terminals


async def _workers(bus) -> list[WorkerInfo]:
    return await bus.list_workers()


@pytest.mark.slow
def test_cost_report_of_a_recorded_demo_model_run(serve, prompt_ids, tenant_factory):
    """The demo model serves three requests in a real WorkerLoop; two samples of its
    heartbeat give a report whose cost, idle share and cost per 1M useful tokens
    follow from the recorded busy/idle seconds and token counts."""
    bus, worker_bus = make_buses("memory")
    started = time.monotonic()
    loop = serve(worker_bus, hourly_price="2.50", heartbeat_interval=0.2)

    def beat_with_idle(seconds: float):
        """Waits until the worker's heartbeat reports at least ``seconds`` idle."""

        def check() -> WorkerInfo | None:
            beat = next(
                (w for w in asyncio.run(_workers(bus)) if w.worker_id == loop.worker_id), None
            )
            return beat if beat and beat.extra["idle_seconds"] >= seconds else None

        return wait_until(check, timeout=60, interval=0.1, message=f"{seconds}s idle reported")

    beat_with_idle(0.3)  # idle: ready, no work
    prompts = [prompt_ids(text) for text in ("Name a color.", "Count to three.", "Tell a story.")]
    terminals = asyncio.run(_run_requests(bus, prompts))
    first = asyncio.run(_workers(bus))
    assert gpu_usage_sample(workers=first) == 1
    (first_beat,) = [w for w in first if w.worker_id == loop.worker_id]
    # More idle time, then a second interval.
    beat_with_idle(first_beat.extra["idle_seconds"] + 0.3)
    last = asyncio.run(_workers(bus))
    assert gpu_usage_sample(workers=last) == 1
    elapsed = time.monotonic() - started

    tenant = tenant_factory()
    for response_id, terminal in terminals:
        usage = terminal.usage
        record_usage(
            response_id=response_id,
            tenant_id=tenant.pk,
            model=MODEL,
            source="api",
            status=terminal.type.value,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
            worker_id=loop.worker_id,
        )
    terminals = [terminal for _, terminal in terminals]
    assert [t.type for t in terminals] == ["completed", "completed", "cancelled"]

    (recorded,) = [w for w in last if w.worker_id == loop.worker_id]
    busy = Decimal(repr(recorded.extra["busy_seconds"]))
    idle = Decimal(repr(recorded.extra["idle_seconds"]))
    assert busy > 0 and idle > Decimal("0.5") and busy + idle <= Decimal(repr(elapsed))
    useful = sum(t.usage.prompt_tokens + t.usage.completion_tokens for t in terminals[:2])
    lost = terminals[2].usage.prompt_tokens + terminals[2].usage.completion_tokens
    assert terminals[2].usage.completion_tokens >= 1

    today = timezone.now().astimezone(UTC).date()
    (row,) = gpu_cost_report(start=today, end=today)
    cost = (busy + idle) / Decimal(3600) * Decimal("2.50")
    assert (row.model, row.busy_seconds, row.idle_seconds) == (MODEL, busy, idle)
    assert row.gpu_cost == cost
    assert row.idle_share == idle / (busy + idle)
    assert (row.useful_tokens, row.lost_tokens) == (useful, lost)
    assert row.cost_per_million_useful == cost * Decimal(10**6) / useful
