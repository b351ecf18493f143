"""Billing fixtures: prices, usage records at chosen times, a real Celery worker.

``celery_worker`` runs a real worker (``celery.contrib.testing``) in a
thread, consuming the billing and fleet queues from Redis: the broker and
result backend are $CELERY_TEST_BROKER_URL, else $REDIS_URL. Tests that use
it must be ``django_db(transaction=True)``, so that the worker's own
database connections see the rows the test committed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, time
from decimal import Decimal

import pytest

from billing.models import Price, UsageRecord
from billing.selectors.pricing import price_in_force
from tenants.models import Tenant, Tier
from tests.redis_helpers import celery_test_url, redis_up

MODEL = "billing-test-model"


@pytest.fixture
def price_factory(tiers) -> Callable[..., Price]:
    """``price_factory(tier, effective_from, prompt, cached, completion, model=MODEL)``."""

    def make(
        tier: Tier | str,
        effective_from: date,
        prompt: str,
        cached: str,
        completion: str,
        model: str = MODEL,
    ) -> Price:
        tier = tiers[tier] if isinstance(tier, str) else tier
        return Price.objects.create(
            model=model,
            tier=tier,
            effective_from=effective_from,
            prompt_per_million=Decimal(prompt),
            cached_prompt_per_million=Decimal(cached),
            completion_per_million=Decimal(completion),
        )

    return make


@pytest.fixture
def record_factory() -> Callable[..., UsageRecord]:
    """``record_factory(tenant, day, prompt, cached, completion, **fields)`` at noon UTC on ``day``.

    Written with the ORM so that records can lie in past months; the
    service's idempotency is tested in test_services. Like the request path
    then, the record carries the tenant's tier at the time and that tier's
    price in force on its day (``tier=``/``price=`` override them).
    """

    def make(
        tenant: Tenant,
        day: date,
        prompt: int,
        cached: int,
        completion: int,
        *,
        model: str = MODEL,
        status: str = UsageRecord.Status.COMPLETED,
        **fields,
    ) -> UsageRecord:
        created_at = fields.pop("created_at", None) or datetime.combine(day, time(12), tzinfo=UTC)
        tier_id = fields.pop("tier", tenant.tier).pk
        if "price" not in fields:
            fields["price"] = price_in_force(
                tier_id=tier_id, model=model, day=created_at.astimezone(UTC).date()
            )
        return UsageRecord.objects.create(
            response_id=f"chatcmpl-{uuid.uuid4().hex}",
            tenant=tenant,
            model=model,
            source=fields.pop("source", UsageRecord.Source.API),
            status=status,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=completion,
            created_at=created_at,
            tier_id=tier_id,
            **fields,
        )

    return make


@pytest.fixture(scope="module")
def celery_worker():
    """A real Celery worker thread (4 threads) on the billing and fleet queues."""
    from celery.contrib.testing.worker import start_worker

    from config.celery_app import app

    url = celery_test_url()
    if not redis_up(url):
        pytest.skip("Redis is not reachable")
    app.conf.update(broker_url=url, result_backend=url, task_always_eager=False)
    # Leftovers of an interrupted run would otherwise be executed here.
    with app.connection_for_write() as conn:
        for queue in ("billing", "fleet"):
            conn.default_channel.queue_purge(queue)
    with start_worker(
        app,
        pool="threads",
        concurrency=4,
        perform_ping_check=False,
        queues=["billing", "fleet"],
        shutdown_timeout=30,
    ) as worker:
        yield worker
