"""The web's /metrics: refusals by reason, stream endings and lags, HTTP and database.

A scripted worker answers on the in-process bus; the numbers are read the
way Prometheus reads them, from GET /metrics through the ASGI app.
Counters are process-wide, so each test compares before and after.
"""

from decimal import Decimal

import openai
import pytest
from asgiref.sync import sync_to_async
from prometheus_client.parser import text_string_to_metric_families

import tenants.ratelimit as ratelimit
from inference.relay import tap as relay
from tests.plugins.asgi_client import ASGIStream, asgi_post, sdk_client, sse_events
from tests.plugins.request_path import DEMO

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]

MESSAGES = [{"role": "user", "content": "Say hi"}]
# Labels our web metrics may carry: never a tenant or an API key.
# Celery task metrics (task, state) share the registry: bounded, never per tenant.
ALLOWED_LABELS = {
    "reason",
    "tier",
    "service_tier",
    "model",
    "status",
    "le",
    "task",
    "state",
    "outcome",
}


@pytest.fixture(autouse=True)
def memory_limiter(memory_bus):
    ratelimit.reset_limiters()
    yield
    ratelimit.reset_limiters()


async def scrape() -> dict[tuple, float]:
    """(sample name, sorted labels) -> value, from GET /metrics."""
    stream = ASGIStream("GET", "/metrics", {}, b"")
    body = (await stream.read_all()).decode()
    assert stream.status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(samples: dict[tuple, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_429s_are_counted_by_reason_tier_and_model(fake_worker, api_key_factory, demo_model):
    """An rpm refusal and a budget refusal, each under its reason."""
    fake_worker(tokens=1)
    _, limited = await sync_to_async(api_key_factory)(tier="pro", rpm_limit=1)
    broke, _ = await sync_to_async(api_key_factory)(tier="enterprise")
    broke.tenant.monthly_budget = Decimal("0")
    await sync_to_async(broke.tenant.save)()
    broke_key = (await sync_to_async(api_key_factory)(tenant=broke.tenant))[1]
    before = await scrape()

    client = sdk_client(limited)
    await client.chat.completions.create(model=DEMO, messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.RateLimitError, match="Rate limit reached for requests"):
        await client.chat.completions.create(model=DEMO, messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.RateLimitError, match="budget"):
        await sdk_client(broke_key).chat.completions.create(
            model=DEMO, messages=MESSAGES, max_tokens=2
        )

    after = await scrape()
    name = "llmp_requests_refused_total"
    grown = {
        key: after[key] - before.get(key, 0.0)
        for key in after
        if key[0] == name and after[key] != before.get(key, 0.0)
    }
    assert grown == {
        (name, (("model", DEMO), ("reason", "requests"), ("tier", "pro"))): 1.0,
        (name, (("model", DEMO), ("reason", "budget"), ("tier", "enterprise"))): 1.0,
    }


async def test_a_streamed_response_is_counted_once_with_its_lags(fake_worker, pro_key):
    """Ended completed, stream closed again, relay and settlement lag observed."""
    fake_worker(tokens=3)
    before = await scrape()
    stream = asgi_post(
        "/v1/chat/completions", pro_key, {"model": DEMO, "messages": MESSAGES, "stream": True}
    )
    frames = sse_events(await stream.read_all())
    assert stream.status == 200 and frames[-1][1] == "[DONE]"
    await relay.drain_background()
    after = await scrape()

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("llmp_responses_total", model=DEMO, status="completed") == 1
    assert value(after, "llmp_streams_open", model=DEMO) == value(
        before, "llmp_streams_open", model=DEMO
    )
    assert grew("llmp_relay_lag_seconds_count", model=DEMO) == 1
    # By tier, service tier and model: the first token as the relay read
    # it, and the queue wait the worker reported (1.4 ms, the scripted
    # terminal's).
    served = {"tier": "pro", "service_tier": "default", "model": DEMO}
    assert grew("llmp_time_to_first_token_seconds_count", **served) == 1
    assert 0 < grew("llmp_time_to_first_token_seconds_sum", **served) < 5
    assert grew("llmp_queue_wait_seconds_count", **served) == 1
    assert grew("llmp_queue_wait_seconds_sum", **served) == pytest.approx(0.0014)
    assert grew("llmp_usage_settlement_lag_seconds_count", model=DEMO) == 1
    # The settlement includes the relay's part, and both are short here.
    settle_sum = grew("llmp_usage_settlement_lag_seconds_sum", model=DEMO)
    assert grew("llmp_relay_lag_seconds_sum", model=DEMO) <= settle_sum < 5
    # django-prometheus: HTTP by view and status, and the database wrapper.
    assert grew("django_http_responses_total_by_status_total", status="200") >= 1
    assert any(key[0] == "django_db_execute_total" and v > 0 for key, v in after.items())


async def test_no_web_metric_is_labelled_by_tenant_or_key(fake_worker, pro_key):
    fake_worker(tokens=1)
    await sdk_client(pro_key).chat.completions.create(model=DEMO, messages=MESSAGES, max_tokens=1)
    await relay.drain_background()
    # Web metrics only: in-process worker tests elsewhere leave llmp_worker_* (tier-labelled) series in the shared registry.
    ours = [
        key
        for key in await scrape()
        if key[0].startswith("llmp_") and not key[0].startswith("llmp_worker_")
    ]
    assert ours
    assert {label for _, labels in ours for label, _ in labels} <= ALLOWED_LABELS


async def test_latency_histograms_are_labelled_by_the_service_tier_served(
    fake_worker, api_key_factory, demo_model
):
    """Priority asked on pro is served (and labelled) default; flex is flex.
    Never a tenant: the label set is tier, service tier and model."""
    fake_worker(tokens=2)
    _, key = await sync_to_async(api_key_factory)(tier="pro")
    client = sdk_client(key)
    before = await scrape()
    for tier in ("flex", "priority"):
        await client.chat.completions.create(model=DEMO, messages=MESSAGES, service_tier=tier)
    await relay.drain_background()
    after = await scrape()

    def grew(name: str, service_tier: str) -> float:
        labels = {"tier": "pro", "service_tier": service_tier, "model": DEMO}
        return value(after, name, **labels) - value(before, name, **labels)

    for name in ("llmp_time_to_first_token_seconds_count", "llmp_queue_wait_seconds_count"):
        assert (grew(name, "flex"), grew(name, "default"), grew(name, "priority")) == (1, 1, 0)
