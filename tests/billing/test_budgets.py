"""Budgets: the ledger's spend, the emailed alerts and the API's hard stop."""

from __future__ import annotations

import asyncio
import uuid
from datetime import date
from decimal import Decimal

import openai
import pytest
from asgiref.sync import sync_to_async
from django.core import mail
from django.utils import timezone

import tenants.ratelimit as ratelimit
from billing import ledger
from billing.models import BudgetAlert, BudgetPolicy, UsageRecord
from billing.selectors import month_spend, month_start
from billing.services import (
    budget_check,
    budget_reserve,
    budget_settle,
    spend_this_month,
)
from billing.services.budgets import BudgetExhausted, _reserve_sync, account_name
from inference.relay import tap as relay
from tests.billing.conftest import MODEL
from tests.plugins.asgi_client import asgi_post, sdk_client, sse_events
from tests.plugins.request_path import DEMO
from tests.usage_records import record_usage

# Transactional: the request path's reads and the ledger's seeds must see
# the records as committed.


def settle(tenant, prompt: int, completion: int, *, model: str = MODEL, status="completed"):
    """A response recorded now, without a hold (as the usage settler writes one after the hold expired)."""
    return record_usage(
        response_id=f"chatcmpl-{uuid.uuid4().hex}",
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


def respond(tenant, prompt: int, completion: int, *, status="completed", max_tokens=None):
    """A response through the request path's steps: hold, record, settle."""
    hold = asyncio.run(
        budget_reserve(
            tenant=tenant,
            tier_id=tenant.tier_id,
            model=MODEL,
            hold_id=f"chatcmpl-{uuid.uuid4().hex}",
            prompt_tokens=prompt,
            completion_tokens=completion if max_tokens is None else max_tokens,
        )
    )
    record, _ = record_usage(
        response_id=hold.hold_id,
        tenant_id=tenant.pk,
        model=MODEL,
        source="api",
        status=status,
        finish_reason="stop",
        prompt_tokens=prompt,
        cached_tokens=0,
        completion_tokens=completion,
        queue_time_ms=0,
        ttft_ms=1,
        duration_ms=1,
        tier_id=hold.tier_id,
        price_id=hold.price_id,
    )
    settled = asyncio.run(
        budget_settle(
            hold=hold,
            status=status,
            prompt_tokens=prompt,
            cached_tokens=0,
            completion_tokens=completion,
        )
    )
    return hold, record, settled


def this_month() -> date:
    return month_start(timezone.now().date())


def account(tenant) -> str:
    return account_name(tenant_id=tenant.pk, salt=tenant.cache_salt, day=this_month())


def forget_account(tenant) -> None:
    """Redis lost the tenant's ledger (a flush, a failover)."""
    book = ledger.get_ledger()
    book.client.delete(*book._keys(account(tenant)))


@pytest.fixture
def priced_tenant(tenant_factory, price_factory):
    """A pro tenant with a budget of 100.00, whose tokens cost 1.00 per 1M prompt and
    10.00 per 1M completion."""
    tenant = tenant_factory(tier="pro")
    tenant.monthly_budget = Decimal("100.00")
    tenant.save()
    price_factory("pro", date(2020, 1, 1), "1", "0.5", "10")
    price_factory("pro", date(2020, 1, 1), "1", "0.5", "10", model=DEMO)
    return tenant


@pytest.mark.django_db(transaction=True)
def test_each_settled_hold_adds_its_records_cost(priced_tenant):
    """A response's hold becomes spend at what its record bills (failed ones are
    free) and a replayed settlement adds nothing."""
    respond(priced_tenant, 1_000_000, 0)
    assert spend_this_month(tenant_id=priced_tenant.pk) == Decimal("1")
    hold, record, settled = respond(priced_tenant, 0, 100_000)
    assert settled is True and record.price_id == hold.price_id is not None
    _, failed, _ = respond(priced_tenant, 5_000_000, 5_000_000, status="failed")
    assert failed.price_id == hold.price_id
    replay = budget_settle(
        hold=hold, status="completed", prompt_tokens=0, cached_tokens=0, completion_tokens=100_000
    )
    assert asyncio.run(replay) is False
    assert spend_this_month(tenant_id=priced_tenant.pk) == Decimal("2")
    assert month_spend(tenant=priced_tenant, period=this_month()) == Decimal("2")


@pytest.mark.django_db(transaction=True)
def test_a_lost_counter_is_reseeded_from_the_records(priced_tenant):
    """Redis lost the ledger: the next read recomputes the month from the records."""
    respond(priced_tenant, 3_000_000, 200_000)
    forget_account(priced_tenant)
    assert spend_this_month(tenant_id=priced_tenant.pk) == Decimal("5")
    respond(priced_tenant, 1_000_000, 0)
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
    """Records the ledger never saw (written by the usage settler, a settlement lost to a
    Redis blip) are caught up by the periodic check, which never lowers it."""
    respond(priced_tenant, 1_000_000, 0)
    settle(priced_tenant, 2_000_000, 0)
    assert spend_this_month(tenant_id=priced_tenant.pk) == Decimal("1")
    budget_check(tenant=priced_tenant)
    assert spend_this_month(tenant_id=priced_tenant.pk) == Decimal("3")
    ledger.get_ledger().catch_up(account=account(priced_tenant), spent=10**10)
    budget_check(tenant=priced_tenant)
    assert spend_this_month(tenant_id=priced_tenant.pk) == Decimal("10")


@pytest.mark.django_db(transaction=True)
def test_budget_reserve_refuses_what_the_worst_case_would_pass(priced_tenant):
    """No budget: never refused. Otherwise a request is refused when spend plus its
    worst case (all of max_tokens) would pass the budget, and once spend reaches it."""
    priced_tenant.monthly_budget = None
    priced_tenant.save()
    respond(priced_tenant, 10**9, 0)
    priced_tenant.monthly_budget = Decimal("2.00")
    priced_tenant.save()
    forget_account(priced_tenant)
    UsageRecord.objects.filter(tenant=priced_tenant).delete()
    respond(priced_tenant, 1_000_000, 0)  # 1.00 spent
    # 0.1M completion tokens may cost 1.00: exactly the budget left.
    respond(priced_tenant, 0, 50_000, max_tokens=100_000)  # 0.50 spent
    with pytest.raises(BudgetExhausted) as caught:
        respond(priced_tenant, 0, 1, max_tokens=100_000)
    assert "monthly budget of 2.00 USD is exhausted (1.50 USD spent" in caught.value.message
    respond(priced_tenant, 500_000, 0)  # 2.00 spent
    with pytest.raises(BudgetExhausted):
        respond(priced_tenant, 0, 0)


@pytest.mark.django_db(transaction=True)
def test_the_request_path_reads_two_rows_and_one_ledger_call(
    priced_tenant, django_assert_num_queries
):
    """No aggregate per request: once the month is known to the ledger, admission
    reads the tenant's budget and the price in force, then holds in one round trip."""
    for _ in range(20):
        settle(priced_tenant, 1_000_000, 0)
    spend_this_month(tenant_id=priced_tenant.pk)
    with django_assert_num_queries(2):
        hold = _reserve_sync(
            tenant=priced_tenant,
            tier_id=priced_tenant.tier_id,
            model=MODEL,
            hold_id="chatcmpl-queries",
            prompt_tokens=10,
            completion_tokens=10,
            use_database=True,
        )
    # 10 prompt tokens at 1.00 and 10 completion tokens at 10.00 per 1M.
    assert hold.account is not None and hold.amount == 110_000  # nano-units


@pytest.fixture
def gated_worker(fake_worker):
    """Streams one delta, then holds every response until ``release()``."""
    ratelimit.reset_limiters()
    # No cached prompt tokens: the spend below is priced at the full prompt rate.
    yield fake_worker(mode="hold", cached=0)
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
    # Recorded outside the request path: the periodic check counts it.
    await sync_to_async(budget_check)(tenant=priced_tenant)

    with pytest.raises(openai.RateLimitError) as caught:
        await sdk_client(key).chat.completions.create(**body)
    assert caught.value.code == "insufficient_quota"
    assert caught.value.body["type"] == "insufficient_quota"
    assert "budget" in caught.value.body["message"]
    assert len(gated_worker.received) == 1

    gated_worker.release()
    rest = await running.read_all()
    assert sse_events(rest)[-1][1] == "[DONE]"
    await relay.drain_background()
    response_id = gated_worker.received[0].response_id
    record = await UsageRecord.objects.aget(response_id=response_id)
    assert (record.status, record.completion_tokens) == ("completed", 2)
    spent = await sync_to_async(spend_this_month)(tenant_id=priced_tenant.pk)
    assert spent == Decimal("1.00") + Decimal(record.prompt_tokens + 20) / Decimal(10**6)
