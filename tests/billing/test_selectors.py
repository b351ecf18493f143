"""Usage reads: time windows, totals and tenant scoping."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import UsageRecord
from billing.selectors import usage_get, usage_list, usage_totals
from tests.usage_records import record_usage

pytestmark = pytest.mark.django_db


def record(tenant, response_id, *, prompt=10, cached=0, completion=5, age=timedelta(0)):
    usage, _ = record_usage(
        response_id=response_id,
        tenant_id=tenant.pk,
        model="m",
        source="api",
        status="completed",
        finish_reason="stop",
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        queue_time_ms=0,
        ttft_ms=1,
        duration_ms=2,
    )
    if age:
        UsageRecord.objects.filter(pk=usage.pk).update(created_at=timezone.now() - age)
    return usage


def test_usage_list_filters_by_window_newest_first(tenant_factory):
    """since is inclusive, until exclusive; other tenants never appear."""
    tenant, other = tenant_factory(), tenant_factory()
    record(tenant, "old", age=timedelta(days=40))
    record(tenant, "mid", age=timedelta(days=10))
    record(tenant, "new")
    record(other, "foreign")
    now = timezone.now()
    assert [u.response_id for u in usage_list(tenant=tenant)] == ["new", "mid", "old"]
    since = now - timedelta(days=30)
    assert [u.response_id for u in usage_list(tenant=tenant, since=since)] == ["new", "mid"]
    until = now - timedelta(days=1)
    assert [u.response_id for u in usage_list(tenant=tenant, until=until)] == ["mid", "old"]


def test_usage_totals_sum_the_tenants_records(tenant_factory):
    """Totals add up prompt, cached and completion tokens since a time."""
    tenant, other = tenant_factory(), tenant_factory()
    record(tenant, "a", prompt=100, cached=40, completion=20)
    record(tenant, "b", prompt=7, cached=0, completion=3)
    record(tenant, "c", prompt=1000, completion=1000, age=timedelta(days=40))
    record(other, "d", prompt=555, completion=555)
    since = timezone.now() - timedelta(days=30)
    assert usage_totals(tenant=tenant, since=since) == {
        "requests": 2,
        "prompt_tokens": 107,
        "cached_tokens": 40,
        "completion_tokens": 23,
        "total_tokens": 130,
    }
    assert usage_totals(tenant=tenant)["total_tokens"] == 2130


def test_usage_totals_are_zero_without_records(tenant_factory):
    """No rows gives zeros, not None."""
    totals = usage_totals(tenant=tenant_factory())
    assert totals == dict.fromkeys(
        ["requests", "prompt_tokens", "cached_tokens", "completion_tokens", "total_tokens"], 0
    )


def test_usage_get_is_scoped_to_the_tenant(tenant_factory):
    """Tenant B asking for tenant A's response id gets None, as for an unknown id."""
    a, b = tenant_factory(), tenant_factory()
    usage = record(a, "chatcmpl-a")
    assert usage_get(tenant=a, response_id="chatcmpl-a").pk == usage.pk
    assert usage_get(tenant=b, response_id="chatcmpl-a") is None
    assert usage_get(tenant=a, response_id="chatcmpl-missing") is None
