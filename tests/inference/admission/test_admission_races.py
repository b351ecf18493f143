"""Budgets and quotas hold under concurrency, through the real API.

100 requests arrive together for a tenant whose monthly budget (or token
quota) affords 10 worst cases. Every admitted response is held by the
worker until all 100 have been answered or admitted, so nothing has been
settled while the admissions race: only the atomic reservation at
admission can stop the 11th. Then the held responses complete, and what
they are billed is checked against the limit.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import date
from decimal import Decimal

import openai
import pytest
from asgiref.sync import sync_to_async

import billing.ledger
import tenants.ratelimit as ratelimit
from billing.ledger.memory_ledger import MemoryLedger
from billing.ledger.redis_ledger import RedisLedger
from billing.models import Price, UsageRecord
from billing.selectors import month_spend, month_start
from inference.relay import tap as relay
from tenants.models import Tier
from tests.plugins.asgi_client import sdk_client
from tests.plugins.fake_worker import FakeWorker
from tests.plugins.request_path import DEMO
from tests.tenants.ratelimit_backends import KINDS, make_limiter, redis_test_url

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]

FIRED, AFFORDED = 100, 10
MAX_TOKENS, USED_TOKENS = 5, 3
MESSAGES = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(params=KINDS)
def claims(request, memory_bus, monkeypatch):
    """The limiter and the budget ledger: in-process, or Redis with their own prefix."""
    ratelimit.reset_limiters()
    if request.param == "memory":
        limiter, book = make_limiter("memory"), MemoryLedger()
    else:
        limiter = make_limiter("redis")
        book = RedisLedger(redis_test_url(), prefix=f"bltest-{uuid.uuid4().hex[:12]}")
    monkeypatch.setattr(ratelimit, "get_limiter", lambda: limiter)
    monkeypatch.setattr(billing.ledger, "get_ledger", lambda: book)
    yield limiter
    ratelimit.reset_limiters()


@pytest.fixture
def held_worker(fake_worker):
    """Answers each request with one delta, then holds it until ``release``."""
    return fake_worker(mode="hold")


@pytest.fixture
def make_tenant(api_key_factory, demo_model):
    """``make_tenant(quota=10**9, budget=None) -> (ApiKey, raw key)`` on a tier of its own
    whose rates and concurrency cap are far above the burst."""

    def make(quota: int = 10**9, budget: Decimal | None = None):
        tier = Tier.objects.create(
            name=f"race-{uuid.uuid4().hex[:8]}",
            display_name="Race test",
            rpm=10_000,
            tpm=10**9,
            monthly_token_quota=quota,
            max_context_tokens=8192,
            max_output_tokens=2048,
            max_concurrent_requests=10_000,
            scheduling_weight=Decimal("0.35"),
            priority=1,
            queue_sla_seconds=60,
            api_access=True,
        )
        demo_model.tiers.add(tier)
        # 1.00 per completion token, prompts free: a worst case costs 5.00.
        Price.objects.create(
            model=DEMO,
            tier=tier,
            effective_from=date(2020, 1, 1),
            prompt_per_million=Decimal(0),
            cached_prompt_per_million=Decimal(0),
            completion_per_million=Decimal(1_000_000),
        )
        api_key, raw = api_key_factory(tier=tier.name)
        api_key.tenant.monthly_budget = budget
        api_key.tenant.save()
        return api_key, raw

    return sync_to_async(make)


async def burst(worker: FakeWorker, key: str) -> tuple[list, list]:
    """FIRED requests at once; returns (completions, refusals) once all have ended."""
    client = sdk_client(key)

    async def one():
        return await client.chat.completions.create(
            model=DEMO, messages=MESSAGES, max_tokens=MAX_TOKENS
        )

    before = len(worker.received)
    tasks = [asyncio.create_task(one()) for _ in range(FIRED)]
    # Every request is either refused (its task ends) or held by the worker.
    deadline = time.monotonic() + 120
    while sum(t.done() for t in tasks) + len(worker.received) - before < FIRED:
        assert time.monotonic() < deadline, "the burst was never fully admitted or refused"
        await asyncio.sleep(0.05)
    worker.release(completion_tokens=USED_TOKENS)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await relay.drain_background()
    refused = [r for r in results if isinstance(r, BaseException)]
    for error in refused:
        assert isinstance(error, openai.RateLimitError), error
        assert error.code == "insufficient_quota"
    return [r for r in results if not isinstance(r, BaseException)], refused


async def test_100_concurrent_requests_never_spend_past_a_budget_that_affords_10(
    claims, held_worker, make_tenant
):
    """Budget 50.00, worst case 5.00 per request: exactly 10 of 100 simultaneous
    requests are admitted, the rest get 429 insufficient_quota, and the month's spend
    (10 x 3 tokens at 1.00) stays within the budget."""
    budget = Decimal("50.00")
    api_key, key = await make_tenant(budget=budget)
    completed, refused = await burst(held_worker, key)
    assert (len(completed), len(refused)) == (AFFORDED, FIRED - AFFORDED)
    assert "budget" in refused[0].body["message"]
    tenant = await sync_to_async(lambda: api_key.tenant)()
    period = month_start(date.today())
    spend = await sync_to_async(month_spend)(tenant=tenant, period=period)
    assert spend == AFFORDED * USED_TOKENS * Decimal(1) <= budget
    assert await UsageRecord.objects.filter(tenant=tenant).acount() == AFFORDED


async def test_100_concurrent_requests_never_use_past_a_quota_that_affords_10(
    claims, held_worker, make_tenant
):
    """A monthly token quota of 10 worst cases (prompt + max_tokens): exactly 10 of
    100 simultaneous requests are admitted and the tokens billed stay within it."""
    probe = asyncio.create_task(
        sdk_client((await make_tenant())[1]).chat.completions.create(
            model=DEMO, messages=MESSAGES, max_tokens=MAX_TOKENS
        )
    )
    while not held_worker.received:
        await asyncio.sleep(0.01)
    held_worker.release(completion_tokens=USED_TOKENS)
    prompt = (await probe).usage.prompt_tokens
    quota = AFFORDED * (prompt + MAX_TOKENS)
    api_key, key = await make_tenant(quota=quota)
    completed, refused = await burst(held_worker, key)
    assert (len(completed), len(refused)) == (AFFORDED, FIRED - AFFORDED)
    used = sum(c.usage.total_tokens for c in completed)
    assert used == AFFORDED * (prompt + USED_TOKENS) <= quota
    period = time.strftime("%Y%m", time.gmtime())
    assert claims.quota_used(tenant_id=api_key.tenant_id, period=period) == used
