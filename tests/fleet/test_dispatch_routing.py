"""Requests through dispatch reach only ready replicas of the model and version."""

from __future__ import annotations

import time

import pytest

from fleet import services
from tests.fleet.traffic import Traffic
from tests.plugins.engine import MODEL
from wire.bus.memory_bus import MemoryBus
from wire.workers import WorkerInfo, WorkerState

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def no_embedded_engine(settings):
    settings.EMBEDDED_ENGINE = False


def test_requests_never_reach_warming_draining_wrong_model_or_unweighted_replicas(
    serve, prompt_ids, tenant_factory
):
    bus = MemoryBus()
    services.deployment_register(model_name=MODEL, version="v1")
    services.deployment_register(model_name=MODEL, version="v2")  # weight 0
    ready = serve(bus, version="v1")
    decoys = [
        WorkerInfo(worker_id="warming", model=MODEL, state=WorkerState.WARMING, version="v1"),
        WorkerInfo(worker_id="draining", model=MODEL, state=WorkerState.DRAINING, version="v1"),
        WorkerInfo(worker_id="other-model", model="other", state=WorkerState.READY, version="v1"),
        WorkerInfo(worker_id="standby", model=MODEL, state=WorkerState.READY, version="v2"),
    ]
    for decoy in decoys:
        bus.register(decoy)
    traffic = Traffic(bus, MODEL, tenant_factory().pk, prompt_ids("Say hi."), concurrency=3)
    traffic.start()
    deadline = time.monotonic() + 60
    while len(traffic.results) < 12 and time.monotonic() < deadline:
        for decoy in decoys:  # keep their heartbeats alive
            bus.heartbeat(decoy)
        time.sleep(0.2)
    traffic.stop()
    assert not traffic.errors
    assert len(traffic.results) >= 12
    assert {(version, worker) for version, _, worker in traffic.results} == {
        ("v1", ready.worker_id)
    }
    assert {status for _, status, _ in traffic.results} == {"completed"}
