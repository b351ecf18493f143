"""A response's claims through the real API: its concurrency slot is renewed while
it streams, failed responses give their tokens back to the monthly quota, and a
budget that cannot be checked refuses (or serves, by the tenant's choice).

A scripted worker answers on the in-process bus; the limiter is in-process
or Redis in turn.
"""

import asyncio
import time
from decimal import Decimal

import openai
import pytest
from asgiref.sync import sync_to_async

import billing.ledger
import tenants.ratelimit as ratelimit
from billing.ledger.redis_ledger import RedisLedger
from billing.selectors import usage_month_tokens
from inference.relay import tap as relay
from tenants.models import Tenant, Tier
from tests.plugins.asgi_client import asgi_post, sdk_client
from tests.plugins.request_path import DEMO
from tests.tenants.ratelimit_backends import KINDS, make_limiter

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]

LEASE_S = 1
MESSAGES = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(params=KINDS)
def limiter(request, memory_bus, monkeypatch, settings):
    """A limiter whose slots are leased for LEASE_S seconds (renewed every third)."""
    settings.RATE_LIMIT_SLOT_TTL = LEASE_S
    ratelimit.reset_limiters()
    shared = make_limiter(request.param, lease_ms=LEASE_S * 1000)
    monkeypatch.setattr(ratelimit, "get_limiter", lambda: shared)
    yield shared
    ratelimit.reset_limiters()


@pytest.fixture
def make_key(api_key_factory, demo_model):
    """``make_key(concurrent=16) -> (ApiKey, raw)`` on a tier of its own."""

    def make(concurrent: int = 16):
        tier = Tier.objects.create(
            name=f"claims-{Tier.objects.count()}",
            display_name="Claims test",
            rpm=100,
            tpm=100_000,
            monthly_token_quota=10**9,
            max_context_tokens=8192,
            max_output_tokens=2048,
            max_concurrent_requests=concurrent,
            scheduling_weight=Decimal("0.35"),
            priority=1,
            queue_sla_seconds=10,
            api_access=True,
        )
        demo_model.tiers.add(tier)
        return api_key_factory(tier=tier.name)

    return sync_to_async(make)


async def create(key: str):
    return await sdk_client(key).chat.completions.create(
        model=DEMO, messages=MESSAGES, max_tokens=5
    )


async def test_a_stream_longer_than_its_lease_keeps_its_slot(fake_worker, limiter, make_key):
    """Cap 1, leases of one second: a stream held for three leases is renewed while it
    lives, so a second request is refused throughout; once it ends, the slot is free."""
    worker = fake_worker(mode="hold")
    api_key, key = await make_key(concurrent=1)
    held = asgi_post(
        "/v1/chat/completions",
        key,
        {"model": DEMO, "messages": MESSAGES, "max_tokens": 5, "stream": True},
    )
    await held.read_until(b"data: ")
    for _ in range(3):
        await asyncio.sleep(LEASE_S)
        with pytest.raises(openai.RateLimitError) as caught:
            # Admitted, it would wait on the held worker: bounded, so that
            # failing is quick.
            await asyncio.wait_for(create(key), 10)
        assert caught.value.code == "rate_limit_exceeded"
        assert caught.value.response.headers["retry-after"] == "1"  # the concurrency cap
    assert await sync_to_async(limiter.in_flight)(tenant_id=api_key.tenant_id) == 1
    await held.disconnect()
    await relay.drain_background()
    assert worker.aborted
    worker.mode = "complete"
    assert (await create(key)).choices


async def test_a_failed_response_gives_its_tokens_back_to_the_monthly_quota(
    fake_worker, limiter, make_key
):
    """Failed responses are not billed, so they use none of the month's quota: not in
    the counter after settlement, nor in the seed a lost counter is rebuilt from."""
    fake_worker(tokens=2, mode="fail")
    api_key, key = await make_key()
    with pytest.raises(openai.InternalServerError):
        await create(key)
    await relay.drain_background()
    period = time.strftime("%Y%m", time.gmtime())
    assert await sync_to_async(limiter.quota_used)(tenant_id=api_key.tenant_id, period=period) == 0
    seed = await sync_to_async(usage_month_tokens)(tenant_id=api_key.tenant_id, period=period)
    assert seed == 0


@pytest.fixture
def ledger_down(monkeypatch):
    """The budget ledger's Redis refuses connections."""
    unreachable = RedisLedger("redis://127.0.0.1:1/0")
    monkeypatch.setattr(billing.ledger, "get_ledger", lambda: unreachable)


@pytest.mark.parametrize(
    ("choice", "served"),
    [(Tenant.BudgetWhenRedisDown.REFUSE, False), (Tenant.BudgetWhenRedisDown.ALLOW, True)],
)
async def test_a_budget_that_cannot_be_checked_refuses_unless_the_tenant_serves_anyway(
    fake_worker, limiter, make_key, ledger_down, choice, served
):
    """A hard budget with Redis unreachable: by default 503 budget_unavailable before
    any GPU work; a tenant that chose "allow" is served without the hard stop."""
    worker = fake_worker(tokens=1)
    api_key, key = await make_key()
    tenant = await sync_to_async(lambda: api_key.tenant)()
    tenant.monthly_budget = Decimal("100")
    if choice == Tenant.BudgetWhenRedisDown.ALLOW:
        tenant.budget_when_redis_down = choice
    await sync_to_async(tenant.save)()
    if served:
        assert (await create(key)).choices
        assert len(worker.received) == 1
        return
    with pytest.raises(openai.APIStatusError) as caught:
        await create(key)
    assert caught.value.status_code == 503
    assert caught.value.code == "budget_unavailable"
    assert caught.value.response.headers["retry-after"] == "5"
    assert worker.received == []
