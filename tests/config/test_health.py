"""/healthz and /readyz of the web: alive always, ready only with database, Redis and workers."""

from __future__ import annotations

import json
import uuid

import pytest
from asgiref.sync import sync_to_async

import fleet.fallback
from fleet import services
from fleet.selectors import served_model_list_active
from fleet.snapshot import snapshot_reset
from tests.plugins.asgi_client import ASGIStream
from tests.wire.bus.buses import UNREACHABLE_REDIS_URL, needs_redis, redis_test_url
from wire.bus import reset_buses
from wire.bus.redis_bus import RedisWorkerBus
from wire.workers import WorkerInfo, WorkerState

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True), needs_redis]

MODEL = "health-test-model"


@pytest.fixture(autouse=True)
def redis_bus(settings):
    """The Redis bus, and a snapshot key of this test's own."""
    settings.REDIS_URL = redis_test_url()
    settings.EMBEDDED_ENGINE = False
    settings.FLEET_SNAPSHOT_KEY = f"test-health-{uuid.uuid4().hex[:10]}:snapshot"
    settings.FLEET_SNAPSHOT_REFRESH = 0.0
    reset_buses()
    snapshot_reset()
    yield
    reset_buses()
    snapshot_reset()


@pytest.fixture
def model(tiers):
    return services.served_model_register(name=MODEL, context_length=2048)


@pytest.fixture
def workers():
    """``workers(state)``: one worker in ``state`` for every active model."""
    bus = RedisWorkerBus(redis_test_url())
    registered: list[str] = []

    def register(state: WorkerState = WorkerState.READY) -> list[str]:
        names = [m.name for m in served_model_list_active()]
        for name in names:
            info = WorkerInfo(worker_id=f"health-{uuid.uuid4().hex[:8]}", model=name, state=state)
            bus.register(info)
            registered.append(info.worker_id)
        return names

    yield sync_to_async(register)
    for worker_id in registered:
        bus.deregister(worker_id)


async def get(path: str) -> tuple[int, dict]:
    stream = ASGIStream("GET", path, {}, b"")
    body = await stream.read_all()
    return stream.status, json.loads(body)


async def test_healthz_answers_without_checking_anything(settings):
    settings.REDIS_URL = UNREACHABLE_REDIS_URL
    assert await get("/healthz") == (200, {"status": "ok"})


async def test_ready_once_every_served_model_has_a_ready_worker(model, workers):
    """503 naming the model with no worker; 200 once each model has a READY one."""
    status, body = await get("/readyz")
    assert status == 503
    assert body["checks"]["workers"][MODEL] == 0
    assert (body["checks"]["database"], body["checks"]["redis"]) == ("ok", "ok")
    await workers(WorkerState.WARMING)
    assert (await get("/readyz"))[0] == 503  # warming up is not ready
    names = await workers(WorkerState.READY)
    status, body = await get("/readyz")
    assert (status, body["status"]) == (200, "ready")
    assert body["checks"]["workers"] == dict.fromkeys(names, 1)


async def test_redis_down_is_not_ready(model, settings):
    settings.REDIS_URL = UNREACHABLE_REDIS_URL
    status, body = await get("/readyz")
    assert status == 503 and body["checks"]["redis"] == "down"


async def test_with_the_database_down_the_snapshot_keeps_the_process_ready(
    model, workers, monkeypatch
):
    """PostgreSQL unreachable: ready on the control snapshot's fallback."""
    await sync_to_async(services.snapshot_publish)()
    await workers(WorkerState.READY)
    monkeypatch.setattr(fleet.fallback, "_db_down_until", float("inf"))
    status, body = await get("/readyz")
    assert (status, body["checks"]["database"]) == (200, "fallback")
    assert MODEL in body["checks"]["workers"]
