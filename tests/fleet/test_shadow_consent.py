"""Shadow comparisons: only for tenants that opted in, and kept for a while only."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import services
from fleet.models import ShadowComparison
from fleet.shadow import _pending
from fleet.tasks import shadow_purge
from inference.relay.dispatch import dispatch_request
from wire.bus.memory_bus import MemoryBus
from wire.requests import GenerationRequest
from wire.sampling import Sampling
from wire.workers import WorkerInfo, WorkerState

MODEL = "shadowed"


@pytest.fixture
def shadowing_rollout(db, settings):
    """v1 stable, v2 canary at 1% with every stable request shadowed."""
    settings.EMBEDDED_ENGINE = False
    services.deployment_register(model_name=MODEL, version="v1")
    services.deployment_register(model_name=MODEL, version="v2")
    rollout = services.rollout_start(
        model_name=MODEL, canary_version="v2", steps=[1, 100], shadow_share=1.0
    )
    services.snapshot_publish()
    return rollout


async def dispatch_on_stable(bus: MemoryBus, *, shadow_allowed: bool) -> list[GenerationRequest]:
    """Dispatch until the router picks v1; what reached the canary's queue."""
    for n in range(50):
        request = GenerationRequest(
            response_id=f"chatcmpl-{n}-{shadow_allowed}",
            model=MODEL,
            prompt_token_ids=[1, 2, 3],
            sampling=Sampling(max_tokens=2),
            tier="pro",
            tenant_id=1,
        )
        worker = await dispatch_request(
            request, bus=bus, routing_key=f"k{n}", shadow_allowed=shadow_allowed
        )
        if worker.version == "v1":
            break
    requests, _ = bus.poll("canary", 0)
    for task in list(_pending):
        task.cancel()
    return [r for r in requests if r.response_id.startswith("shadow-")]


@pytest.mark.asyncio
async def test_only_opted_in_tenants_are_shadowed(shadowing_rollout):
    bus = MemoryBus()
    for worker_id, version in (("stable", "v1"), ("canary", "v2")):
        bus.register(
            WorkerInfo(worker_id=worker_id, model=MODEL, state=WorkerState.READY, version=version)
        )
    assert await dispatch_on_stable(bus, shadow_allowed=False) == []
    shadows = await dispatch_on_stable(bus, shadow_allowed=True)
    assert len(shadows) == 1 and shadows[0].priority == 0
    await asyncio.sleep(0)


@pytest.mark.django_db
def test_the_beat_purges_old_comparisons_and_withdrawn_consent(
    shadowing_rollout, tenant_factory, settings
):
    settings.SHADOW_RETENTION_DAYS = 7
    consenting, withdrawn = tenant_factory(), tenant_factory()
    for tenant, opted in ((consenting, True), (withdrawn, False)):
        tenant.shadow_opt_in = opted
        tenant.save()

    def comparison(tenant, age_days: float) -> ShadowComparison:
        row = services.shadow_comparison_record(
            rollout_id=shadowing_rollout.pk,
            tenant_id=tenant.pk,
            response_id=f"r-{tenant.pk}-{age_days}",
            shadow_response_id=f"s-{tenant.pk}-{age_days}",
            prompt_tokens=3,
            stable_version="v1",
            canary_version="v2",
            stable=("completed", "customer text", 2),
            canary=("completed", "customer text", 2),
        )
        created = timezone.now() - timedelta(days=age_days)
        ShadowComparison.objects.filter(pk=row.pk).update(created_at=created)
        return row

    fresh = comparison(consenting, 1)
    comparison(consenting, 8)
    comparison(withdrawn, 1)
    assert "fleet-shadow-purge" in {
        name
        for name, entry in settings.CELERY_BEAT_SCHEDULE.items()
        if entry["task"] == "fleet.tasks.shadow_purge"
    }
    assert shadow_purge.apply().get() == 2
    assert list(ShadowComparison.objects.all()) == [fresh]
