"""usage_record_create: exactly once per response id, validated counts."""

import threading
import uuid

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, connections

from billing.models import UsageRecord
from tests.usage_records import record_usage


def usage_kwargs(tenant, **overrides) -> dict:
    kwargs = {
        "response_id": f"chatcmpl-{uuid.uuid4().hex}",
        "tenant_id": tenant.pk,
        "model": "smollm2-135m-instruct",
        "source": "api",
        "status": "completed",
        "finish_reason": "stop",
        "prompt_tokens": 12,
        "cached_tokens": 4,
        "completion_tokens": 30,
        "queue_time_ms": 3,
        "ttft_ms": 40,
        "duration_ms": 900,
        "worker_id": "worker-0",
    }
    kwargs.update(overrides)
    return kwargs


@pytest.mark.django_db
def test_creates_a_record_with_every_field(api_key_factory, user_factory):
    """The row carries tenant, key, user, counts and timings; total is derived."""
    api_key, _ = api_key_factory()
    user = user_factory(tenant=api_key.tenant)
    kwargs = usage_kwargs(api_key.tenant, api_key_id=api_key.pk, user_id=user.pk)
    record, created = record_usage(**kwargs)
    assert created is True
    stored = UsageRecord.objects.get(response_id=kwargs["response_id"])
    assert (stored.tenant_id, stored.api_key_id, stored.user_id) == (
        api_key.tenant_id,
        api_key.pk,
        user.pk,
    )
    assert (stored.prompt_tokens, stored.cached_tokens, stored.completion_tokens) == (12, 4, 30)
    assert (stored.queue_time_ms, stored.ttft_ms, stored.duration_ms) == (3, 40, 900)
    assert stored.total_tokens == 42
    assert stored.worker_id == "worker-0"


@pytest.mark.django_db
def test_a_replay_returns_the_first_record_unchanged(tenant_factory):
    """A second write for the same response id changes nothing."""
    tenant = tenant_factory()
    kwargs = usage_kwargs(tenant)
    first, created = record_usage(**kwargs)
    again, created_again = record_usage(**{**kwargs, "completion_tokens": 999})
    assert (created, created_again) == (True, False)
    assert again.pk == first.pk
    assert again.completion_tokens == 30
    assert UsageRecord.objects.filter(response_id=kwargs["response_id"]).count() == 1


@pytest.mark.django_db
def test_console_usage_needs_no_api_key(tenant_factory):
    """Console requests are recorded without a key; ttft may be unknown."""
    tenant = tenant_factory(tier="free")
    kwargs = usage_kwargs(
        tenant, source="console", status="cancelled", finish_reason="", ttft_ms=None
    )
    record, created = record_usage(**kwargs)
    assert created and record.api_key_id is None and record.ttft_ms is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    "override",
    [
        {"prompt_tokens": -1},
        {"completion_tokens": -5},
        {"cached_tokens": -1},
        {"queue_time_ms": -1},
        {"duration_ms": -1},
        {"ttft_ms": -1},
        {"cached_tokens": 13},  # more than the 12 prompt tokens
        {"source": "fax"},
        {"status": "exploded"},
    ],
)
def test_invalid_values_are_rejected(tenant_factory, override):
    """Negative counts, impossible cache hits and unknown enums raise ValidationError."""
    kwargs = usage_kwargs(tenant_factory(), **override)
    with pytest.raises(ValidationError):
        record_usage(**kwargs)
    assert not UsageRecord.objects.filter(response_id=kwargs["response_id"]).exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_create_exactly_one_record(tenant_factory):
    """Threads on separate connections racing on one response id: one row.

    A barrier releases all writers at once, so several pass the initial
    lookup and collide on the unique index; each must still get the same
    row back, and exactly one must report created=True.
    """
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL for real concurrent connections")
    tenant = tenant_factory()
    writers, rounds = 8, 5
    for _ in range(rounds):
        kwargs = usage_kwargs(tenant)
        barrier = threading.Barrier(writers)
        results, errors = [], []

        def write(kwargs=kwargs, barrier=barrier, results=results, errors=errors):
            try:
                barrier.wait(timeout=10)
                results.append(record_usage(**kwargs))
            except Exception as exc:  # reported by the assertion below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=write) for _ in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert errors == []
        assert len(results) == writers
        assert sum(created for _, created in results) == 1
        assert len({record.pk for record, _ in results}) == 1
        assert UsageRecord.objects.filter(response_id=kwargs["response_id"]).count() == 1
