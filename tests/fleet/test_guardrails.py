"""Guardrail verdicts and the usage-record metrics they compare."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.guardrails import guardrails_check
from fleet.selectors import VersionMetrics, version_metrics
from tests.usage_records import record_usage

STABLE = VersionMetrics(100, 0.01, 200.0, 0.0, 0.02)


def metrics(**changes) -> VersionMetrics:
    values = {
        "requests": 40,
        "error_rate": 0.01,
        "ttft_p95_ms": 210.0,
        "content_filter_rate": 0.0,
        "regenerate_rate": 0.02,
    }
    return VersionMetrics(**{**values, **changes})


def test_a_canary_like_stable_passes():
    verdict = guardrails_check(canary=metrics(), stable=STABLE, limits={})
    assert verdict.passed and not verdict.breaches


@pytest.mark.parametrize(
    ("changes", "metric"),
    [
        ({"error_rate": 0.10}, "error_rate"),
        ({"content_filter_rate": 0.05}, "content_filter_rate"),
        ({"regenerate_rate": 0.20}, "regenerate_rate"),
        ({"ttft_p95_ms": 400.0}, "ttft_p95"),
    ],
)
def test_each_guardrail_breaches_on_its_own(changes, metric):
    verdict = guardrails_check(canary=metrics(**changes), stable=STABLE, limits={})
    assert not verdict.passed
    assert [b.split()[0] for b in verdict.breaches] == [metric]


def test_too_few_requests_neither_pass_nor_breach():
    verdict = guardrails_check(canary=metrics(requests=2, error_rate=0.5), stable=STABLE, limits={})
    assert not verdict.enough_data and not verdict.breaches


@pytest.mark.django_db
def test_version_metrics_come_from_usage_records(tenant_factory):
    tenant = tenant_factory()
    since = timezone.now() - timedelta(seconds=1)
    rows = [
        ("completed", "stop", 100, False),
        ("completed", "content_filter", 300, True),
        ("failed", "", None, False),
        ("cancelled", "", 50, False),  # the client left: not counted
    ]
    for i, (status, finish, ttft, regenerated) in enumerate(rows):
        record_usage(
            response_id=f"gr-{tenant.pk}-{i}", tenant_id=tenant.pk, model="m", source="api",
            status=status, finish_reason=finish, prompt_tokens=5, cached_tokens=0,
            completion_tokens=1, queue_time_ms=0, ttft_ms=ttft, duration_ms=1,
            model_version="v9", regenerated=regenerated,
        )  # fmt: skip
    found = version_metrics(model="m", version="v9", since=since)
    assert found.requests == 3
    assert found.error_rate == pytest.approx(1 / 3)
    assert found.content_filter_rate == pytest.approx(1 / 3)
    assert found.regenerate_rate == pytest.approx(1 / 3)
    assert found.ttft_p95_ms == 300.0
    assert version_metrics(model="m", version="v8", since=since).requests == 0
