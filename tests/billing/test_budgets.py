"""Budgets: the spend counter, the emailed alerts and the API's hard stop."""

from __future__ import annotations

import asyncio
from datetime import date
from decimal import Decimal

import openai
import pytest
from asgiref.sync import sync_to_async
from django.core import mail
from django.core.cache import cache
from django.utils import timezone

import tenants.ratelimit as ratelimit
from billing.models import BudgetAlert, BudgetPolicy, UsageRecord
from billing.selectors import month_spend, month_start
from billing.services import budget_admit, budget_check, spend_this_month, usage_record_create
from billing.services.budgets import BudgetExhausted, _budget_check_sync, spend_cache_key
from inference import relay
from tests.billing.conftest import MODEL
from tests.inference.asgi_client import asgi_post, sdk_client, sse_events
from tests.inference.conftest import DEMO, ScriptedWorker
from wire.events import EventType, delta_event, terminal_event, usage_body

# Transactional: a record feeds the counter on commit, which a test
# wrapped in one transaction never reaches.


def settle(tenant, prompt: int, completion: int, *, model: str = MODEL, status="completed"):
    """A response settled now, through the service the relay calls."""
    return usage_record_create(
        response_id=f"chatcmpl-{UsageRecord.objects.count()}-{tenant.pk}-{prompt}-{completion}",
        tenant_id=tenant.pk,
        model=model,
        source="api",
        status=status,
        finish_reason="stop",
        prompt_tokens=prompt,
        cached_tokens=0,
        completion_tokens=completion,
        queue_time_ms=0,
        ttft_ms=1,
        duration_ms=1,
    )[0]


def this_month() -> date:
    return month_start(timezone.now().date())


@pytest.fixture
def priced_tenant(tenant_factory, price_factory):
    """A pro tenant whose tokens cost 1.00 per 1M prompt and 10.00 per 1M completion."""
    tenant = tenant_factory(tier="pro")
    price_factory("pro", date(2020, 1, 1), "1", "0.5", "10")
    price_factory("pro", date(2020, 1, 1), "1", "0.5", "10", model=DEMO)
    return tenant


@pytest.mark.django_db(transaction=True)
def test_each_new_record_adds_its_cost_to_the_counter(priced_tenant):
    """The counter follows settled records (failed ones are free) and a replayed
    settlement adds nothing."""
    settle(priced_tenant, 1_000_000, 0)
    assert spend_this_month(tenant_id=priced_tenant.pk) == Decimal("1")
    record = settle(priced_tenant, 0, 100_000)
    settle(priced_tenant, 5_000_000, 5_000_000, status="failed")
    usage_record_create(
        **{
            f.name: getattr(record, f.name)
            for f in UsageRecord._meta.fields
            if f.name
            in (
                "response_id",
                "model",
                "source",
                "status",
                "finish_reason",
                "prompt_tokens",
                "cached_tokens",
                "completion_tokens",
                "queue_time_ms",
                "ttft_ms",
                "duration_ms",
            )
        },
        tenant_id=priced_tenant.pk,
    )
    assert spend_this_month(tenant_id=priced_tenant.pk) == Decimal("2")
    assert month_spend(tenant=priced_tenant, period=this_month()) == Decimal("2")


@pytest.mark.django_db(transaction=True)
def test_a_lost_counter_is_reseeded_from_the_records(priced_tenant):
    """Redis lost the key: the next read recomputes the month from the records."""
    settle(priced_tenant, 3_000_000, 200_000)
    cache.delete(spend_cache_key(priced_tenant.pk, priced_tenant.cache_salt, this_month()))
    assert spend_this_month(tenant_id=priced_tenant.pk) == Decimal("5")
    settle(priced_tenant, 1_000_000, 0)
    assert spend_this_month(tenant_id=priced_tenant.pk) == Decimal("6")


@pytest.mark.django_db(transaction=True)
def test_alerts_go_out_once_per_month_at_the_soft_ratio_and_the_budget(priced_tenant, user_factory):
    """Soft alert at 50% (the tenant's policy) to the admins and the billing address,
    once; the hard alert once the budget is spent."""
    admin = user_factory(tenant=priced_tenant, role="admin")
    admin.email = "admin@example.com"
    admin.save()
    user_factory(tenant=priced_tenant, role="member")  # members are not emailed
    priced_tenant.monthly_budget = Decimal("10.00")
    priced_tenant.save()
    BudgetPolicy.objects.create(
        tenant=priced_tenant, soft_alert_ratio=Decimal("0.50"), alert_email="billing@example.com"
    )

    settle(priced_tenant, 4_000_000, 0)
    assert budget_check(tenant=priced_tenant) == []
    settle(priced_tenant, 1_000_000, 0)
    assert budget_check(tenant=priced_tenant) == ["soft"]
    assert budget_check(tenant=priced_tenant) == []
    (soft,) = mail.outbox
    assert soft.to == ["admin@example.com", "billing@example.com"]
    assert "50% of the monthly budget" in soft.subject
    assert "5.00 USD of its monthly budget of 10.00 USD" in soft.body

    settle(priced_tenant, 0, 500_000)
    assert budget_check(tenant=priced_tenant) == ["hard"]
    assert budget_check(tenant=priced_tenant) == []
    assert len(mail.outbox) == 2 and "exhausted" in mail.outbox[1].subject
    kinds = set(BudgetAlert.objects.filter(tenant=priced_tenant).values_list("kind", flat=True))
    assert kinds == {"soft", "hard"}


@pytest.mark.django_db(transaction=True)
def test_budget_check_raises_a_counter_that_fell_behind(priced_tenant):
    """A counter below the records' spend (an increment lost) is corrected upward."""
    priced_tenant.monthly_budget = Decimal("100")
    priced_tenant.save()
    settle(priced_tenant, 2_000_000, 0)
    cache.set(spend_cache_key(priced_tenant.pk, priced_tenant.cache_salt, this_month()), 5)
    budget_check(tenant=priced_tenant)
    assert spend_this_month(tenant_id=priced_tenant.pk) == Decimal("2")


@pytest.mark.django_db(transaction=True)
def test_budget_admit_refuses_once_spend_reaches_the_budget(priced_tenant):
    """No budget: never refused. Below: admitted. At or over: BudgetExhausted."""
    asyncio.run(budget_admit(tenant_id=priced_tenant.pk))
    priced_tenant.monthly_budget = Decimal("2.00")
    priced_tenant.save()
    settle(priced_tenant, 1_999_999, 0)
    asyncio.run(budget_admit(tenant_id=priced_tenant.pk))
    settle(priced_tenant, 1, 0)
    with pytest.raises(BudgetExhausted) as caught:
        asyncio.run(budget_admit(tenant_id=priced_tenant.pk))
    assert "monthly budget of 2.00 USD is exhausted" in caught.value.message


@pytest.mark.django_db(transaction=True)
def test_the_request_path_reads_one_row_and_one_counter(priced_tenant, django_assert_num_queries):
    """No aggregate per request: once the counter exists, admission is one primary-key
    read (the budget) and a cache read."""
    priced_tenant.monthly_budget = Decimal("50")
    priced_tenant.save()
    for _ in range(20):
        settle(priced_tenant, 1_000_000, 0)
    spend_this_month(tenant_id=priced_tenant.pk)
    with django_assert_num_queries(1):
        _budget_check_sync(priced_tenant.pk)


class GatedWorker(ScriptedWorker):
    """Streams one delta, then holds every response until ``finish()``."""

    def _answer(self, request) -> None:
        rid, prompt = request.response_id, len(request.prompt_token_ids)
        self.mode = "hold"
        super()._answer(request)
        self._prompts = {**getattr(self, "_prompts", {}), rid: prompt}

    def finish(self) -> None:
        for rid, (seq, prompt, completion) in list(self._held.items()):
            self._held.pop(rid)
            self.bus.publish(rid, delta_event(seq + 1, [self._choice()]))
            usage = usage_body(prompt_tokens=prompt, completion_tokens=completion + 1)
            self.bus.publish(
                rid,
                terminal_event(
                    EventType.COMPLETED, seq + 2, usage=usage, finish_reasons={"0": "stop"}
                ),
            )

    @staticmethod
    def _choice() -> dict:
        return {
            "index": 0,
            "text": "done",
            "token_ids": [7],
            "logprobs": None,
            "finish_reason": "stop",
        }


@pytest.fixture
def gated_worker(memory_bus):
    ratelimit.reset_limiters()
    worker = GatedWorker().start()
    yield worker
    worker.stop()
    ratelimit.reset_limiters()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_db_threads")
async def test_the_api_stops_at_the_budget_and_running_requests_are_still_recorded(
    gated_worker, priced_tenant, api_key_factory, demo_model
):
    """A stream admitted under budget keeps running; spend passes the budget; the next
    request is a 429 insufficient_quota naming the budget and never reaches a worker;
    the running stream then completes and its usage is recorded and counted."""
    priced_tenant.monthly_budget = Decimal("1.00")
    await sync_to_async(priced_tenant.save)()
    _, key = await sync_to_async(api_key_factory)(tenant=priced_tenant)
    body = {"model": DEMO, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
    running = asgi_post("/v1/chat/completions", key, {**body, "stream": True})
    await running.read_until(b"data: ")
    assert running.status == 200

    await sync_to_async(settle)(priced_tenant, 0, 100_000, model=DEMO)  # 1.00 spent

    with pytest.raises(openai.RateLimitError) as caught:
        await sdk_client(key).chat.completions.create(**body)
    assert caught.value.code == "insufficient_quota"
    assert caught.value.body["type"] == "insufficient_quota"
    assert "budget" in caught.value.body["message"]
    assert len(gated_worker.received) == 1

    gated_worker.finish()
    rest = await running.read_all()
    assert sse_events(rest)[-1][1] == "[DONE]"
    await relay.drain_background()
    response_id = gated_worker.received[0].response_id
    record = await UsageRecord.objects.aget(response_id=response_id)
    assert (record.status, record.completion_tokens) == ("completed", 2)
    spent = await sync_to_async(spend_this_month)(tenant_id=priced_tenant.pk)
    assert spent == Decimal("1.00") + Decimal(record.prompt_tokens + 20) / Decimal(10**6)
