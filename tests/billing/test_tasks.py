"""Beat's periodic tasks on a real Celery worker: GPU sampling (fleet queue), roll-ups, budgets."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import date
from decimal import Decimal

import pytest
from django.conf import settings
from django.core import mail
from django.utils import timezone

from billing import tasks
from billing.models import DailyUsage, GpuUsageSample
from config.celery_app import app
from tests.redis_helpers import celery_test_url
from tests.wire.bus.buses import uid
from wire.bus.redis_bus import RedisWorkerBus
from wire.workers import WorkerInfo, WorkerState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]
TIMEOUT = 60


def test_routes_and_schedule():
    """billing.* on the billing queue, GPU sampling on fleet; beat runs all four jobs."""
    route = app.amqp.router.route
    assert route({}, "billing.tasks.invoice_issue")["queue"].name == "billing"
    assert route({}, "billing.tasks.gpu_usage_sample")["queue"].name == "fleet"
    assert route({}, "fleet.tasks.anything")["queue"].name == "fleet"
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert scheduled >= {
        "billing.tasks.daily_usage_rollup",
        "billing.tasks.invoices_issue_monthly",
        "billing.tasks.budgets_check",
        "billing.tasks.gpu_usage_sample",
    }
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost


def test_gpu_sampling_reads_the_worker_registry_on_redis():
    """A worker's heartbeat on the Redis registry becomes one sample; a rerun on the same
    heartbeat adds none."""
    worker_bus = RedisWorkerBus(settings.REDIS_URL)
    worker_id = uid("gpu")
    extra = {"boot_id": "boot", "busy_seconds": 12.5, "idle_seconds": 47.5, "hourly_price": "1.8"}
    worker_bus.register(
        WorkerInfo(worker_id=worker_id, model="m", state=WorkerState.READY, extra=extra)
    )
    try:
        assert tasks.gpu_usage_sample.delay().get(timeout=TIMEOUT) >= 1
        tasks.gpu_usage_sample.delay().get(timeout=TIMEOUT)
    finally:
        worker_bus.deregister(worker_id)
    (sample,) = GpuUsageSample.objects.filter(worker_id=worker_id)
    assert (sample.busy_seconds, sample.idle_seconds, sample.hourly_price) == (
        12.5,
        47.5,
        Decimal("1.8"),
    )


def test_rollup_and_budget_tasks(tenant_factory, price_factory, record_factory, user_factory):
    """The roll-up task rebuilds a day; the budget task emails the hard alert once."""
    tenant = tenant_factory(tier="pro")
    price_factory("pro", date(2020, 1, 1), "1", "1", "1")
    record_factory(tenant, date(2025, 3, 1), 1000, 0, 1000)
    assert tasks.daily_usage_rollup.delay("2025-03-01").get(timeout=TIMEOUT) == {"2025-03-01": 1}
    assert DailyUsage.objects.filter(tenant=tenant, day=date(2025, 3, 1)).count() == 1

    record_factory(tenant, timezone.now().date(), 1_000_000, 0, 1_000_000)  # 2.00 this month
    tenant.monthly_budget = Decimal("1.00")
    tenant.save()
    admin = user_factory(tenant=tenant, role="admin")
    admin.email = "owner@example.com"
    admin.save()
    sent = tasks.budgets_check.delay().get(timeout=TIMEOUT)
    again = tasks.budgets_check.delay().get(timeout=TIMEOUT)
    assert sent[str(tenant.pk)] == ["soft", "hard"] and str(tenant.pk) not in again
    # The worker thread sends through the same locmem backend as the test.
    assert [m.to for m in mail.outbox] == [["owner@example.com"], ["owner@example.com"]]


@pytest.mark.slow
def test_beat_drives_gpu_sampling_through_redis(tmp_path):
    """``celery beat`` (a real process, 1 s sampling interval) enqueues the sampling
    task on Redis; the worker runs it and the registered worker's seconds are recorded."""
    worker_bus = RedisWorkerBus(settings.REDIS_URL)
    worker_id = uid("beat")
    extra = {"boot_id": "boot", "busy_seconds": 3.0, "idle_seconds": 4.0, "hourly_price": "1"}
    info = WorkerInfo(worker_id=worker_id, model="m", state=WorkerState.READY, extra=extra)
    worker_bus.register(info)
    stop = threading.Event()

    def heartbeat() -> None:  # a registered worker stays listed only while it beats
        while not stop.wait(0.5):
            info.heartbeat_at = time.time()
            worker_bus.heartbeat(info)

    threading.Thread(target=heartbeat, daemon=True).start()
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)},
        "CELERY_BROKER_URL": celery_test_url(),
        "GPU_SAMPLE_INTERVAL": "1",
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    command = [sys.executable, "-m", "celery", "-A", "config.celery_app", "beat"]
    log = (tmp_path / "beat.log").open("w")
    beat = subprocess.Popen(
        [*command, "-s", str(tmp_path / "schedule"), "-l", "info"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not GpuUsageSample.objects.filter(worker_id=worker_id).exists():
            assert beat.poll() is None, (tmp_path / "beat.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "beat.log").read_text()
            time.sleep(0.3)
    finally:
        beat.terminate()
        beat.wait(20)
        stop.set()
        worker_bus.deregister(worker_id)
    (sample,) = GpuUsageSample.objects.filter(worker_id=worker_id)
    assert (sample.busy_seconds, sample.idle_seconds) == (3.0, 4.0)
