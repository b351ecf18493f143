"""A response the web process never settles is still recorded, once.

The web tier and a real ``WorkerLoop`` (the demo engine) share this
process and the in-process bus, as in embedded mode. The web process
"dies" mid-stream: its relay task is cancelled after the first delta, so
its terminal hook (the record and the claims' settlement) never runs,
while the worker, which nobody asked to stop, finishes the response. The
settler then writes exactly one record with the worker's counts, dated
when the request was made, and settles the rate-limit reservation.
"""

# Fixtures come from other packages' conftests, imported by name.
# ruff: noqa: F401, F811

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime

import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from billing.services import usage_settle_pending
from gpuworkers.worker import WorkerLoop
from inference.api.chat import chat_request
from inference.api.schemas import ChatCompletionRequest
from inference.services import generation_start
from tenants.ratelimit import get_limiter, reset_limiters
from tenants.selectors import api_key_authenticate
from tests.helpers import async_wait_until
from tests.plugins.request_path import DEMO
from tests.serving import serving_worker
from wire.bus import get_worker_bus
from wire.usage import get_usage_stream, reset_usage_streams

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads", "demo_model"),
]


@pytest.fixture
def worker(engine, memory_bus):
    """The demo engine on the in-process bus, with fresh usage streams and limiters."""
    reset_usage_streams()
    reset_limiters()
    with serving_worker(engine, DEMO, "settle") as loop:
        yield loop
    reset_usage_streams()


async def test_a_response_whose_web_process_died_is_settled_once_from_the_worker(
    worker, api_key_factory
):
    _, raw = await sync_to_async(api_key_factory)(tier="pro")
    api_key = await sync_to_async(api_key_authenticate)(raw_key=raw)
    request = ChatCompletionRequest(
        model=DEMO,
        messages=[{"role": "user", "content": "Count from one to twenty."}],
        max_tokens=24,
        temperature=0,
    )
    before = datetime.now(UTC)
    tenant = api_key.tenant
    internal = chat_request(request, tenant=tenant)
    tap = await generation_start(request=internal, tenant=tenant, api_key=api_key)
    response_id = tap.route.response_id
    first = await tap.next_event(timeout=60)
    assert first is not None and first.type in ("created", "delta")
    # The web process goes away: its relay never reaches the terminal event.
    tap.task.cancel()
    stream = get_usage_stream()
    await async_wait_until(lambda: stream.size() == 1, timeout=60)
    assert not await UsageRecord.objects.filter(response_id=response_id).aexists()
    limiter = get_limiter()
    period = datetime.now(UTC).strftime("%Y%m")
    reserved = limiter.quota_used(tenant_id=api_key.tenant_id, period=period)

    settle = sync_to_async(usage_settle_pending)
    report = await settle(consumer="test")
    again = await settle(consumer="test", min_idle_ms=0)

    assert (report.recorded, again.recorded, again.known) == (1, 0, 0)
    record = await UsageRecord.objects.aget(response_id=response_id)
    assert record.status == "completed" and record.finish_reason in ("stop", "length")
    assert 0 < record.completion_tokens <= 24
    assert record.prompt_tokens == tap.route.prompt_tokens
    assert record.worker_id == worker.worker_id
    assert (record.api_key_id, record.tier_id) == (api_key.pk, api_key.tenant.tier_id)
    # Dated when it was requested (the enqueue), not when it was settled.
    assert before <= record.created_at
    assert abs(record.created_at.timestamp() - tap.sent_at) < 1e-3
    # The reservation (prompt + 24) settled to what the record bills.
    billed = record.prompt_tokens + record.completion_tokens
    assert reserved == record.prompt_tokens + 24
    assert limiter.quota_used(tenant_id=api_key.tenant_id, period=period) == billed
