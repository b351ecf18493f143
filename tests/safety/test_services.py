"""Safety events' retention: old events go, withdrawn opt-ins lose their text."""

from datetime import timedelta

import pytest
from django.utils import timezone

from safety.models import SafetyEvent, TenantSafetyPolicy
from safety.tasks import events_purge

pytestmark = pytest.mark.django_db


def event(tenant, *, age_days: int = 0, text: str = "") -> SafetyEvent:
    created = SafetyEvent.objects.create(
        tenant=tenant, stage="prompt", outcome="flagged", text=text, text_chars=len(text)
    )
    # auto_now_add ignores a value given at create: age it afterwards.
    SafetyEvent.objects.filter(pk=created.pk).update(
        created_at=timezone.now() - timedelta(days=age_days)
    )
    return created


def test_the_beat_purge_keeps_recent_events_and_only_opted_in_text(tenant_factory, settings):
    settings.SAFETY_EVENT_RETENTION_DAYS = 30
    opted_in, withdrawn = tenant_factory(), tenant_factory()
    TenantSafetyPolicy.objects.create(tenant=opted_in, store_text=True)
    # Opted in when these were recorded, withdrawn since.
    TenantSafetyPolicy.objects.create(tenant=withdrawn, store_text=False)
    old = event(opted_in, age_days=31, text="kept for review")
    recent = event(opted_in, age_days=29, text="kept for review")
    no_longer = event(withdrawn, age_days=1, text="was kept")

    assert events_purge() == {"deleted": 1, "texts_blanked": 1}

    assert not SafetyEvent.objects.filter(pk=old.pk).exists()
    assert SafetyEvent.objects.get(pk=recent.pk).text == "kept for review"
    left = SafetyEvent.objects.get(pk=no_longer.pk)
    # The event itself stays (counts, findings, hash); only its text goes.
    assert left.text == "" and left.text_chars == len("was kept")


def test_the_purge_is_on_the_beat_and_a_queue_a_worker_reads(settings):
    from config.celery_app import app

    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert "safety.tasks.events_purge" in scheduled
    # The Procfile's and compose's Celery worker reads billing and fleet.
    assert app.amqp.router.route({}, "safety.tasks.events_purge")["queue"].name in {
        "billing",
        "fleet",
    }
