"""/fleet/signal and /fleet/state: for staff sessions and the orchestrator's token."""

from __future__ import annotations

import pytest

from tests.wire.bus.buses import uid
from wire.bus import get_worker_bus, reset_buses
from wire.workers import WorkerInfo, WorkerState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def registered(settings):
    settings.FLEET_SIGNAL_TOKEN = "orchestrator-token"
    reset_buses()
    model = uid("model")
    infos = [
        WorkerInfo(worker_id=uid("w"), model=model, state=WorkerState.READY, version="v1"),
        WorkerInfo(worker_id=uid("w"), model=model, state=WorkerState.WARMING, version="v1"),
    ]
    bus = get_worker_bus()
    for info in infos:
        bus.register(info)
    yield model, infos
    for info in infos:
        bus.deregister(info.worker_id)
    reset_buses()


async def test_the_signal_needs_the_token_or_a_staff_session(async_client, registered):
    """403 without the token or with a wrong one; with it, the model's signal.

    The set-up implies the action: no snapshot is published (the fleet
    conftest's fresh key), so no deployment sets a replica floor and the
    floor is one replica, with no warm reserve; the READY replica holds no
    tokens and has no queue. One replica is wanted, two are up or warming:
    scale_down by one.
    """
    model, _ = registered
    assert (await async_client.get("/fleet/signal")).status_code == 403
    wrong = await async_client.get("/fleet/signal", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403
    response = await async_client.get(
        "/fleet/signal", headers={"Authorization": "Bearer orchestrator-token"}
    )
    assert response.status_code == 200
    signal = next(s for s in response.json()["models"] if s["model"] == model)
    assert (signal["ready"], signal["warming"]) == (1, 1)
    assert (signal["admitted_tokens"], signal["queue_age_seconds"]) == (0, 0.0)
    assert (signal["desired_replicas"], signal["delta"]) == (1, -1)
    assert signal["action"] == "scale_down"


async def test_the_fleet_view_shows_each_replica_state(async_client, registered, admin_user):
    model, infos = registered
    await async_client.aforce_login(admin_user)
    response = await async_client.get("/fleet/state")
    assert response.status_code == 200
    states = {r["worker_id"]: r["state"] for r in response.json()["replicas"]}
    assert states[infos[0].worker_id] == "ready"
    assert states[infos[1].worker_id] == "warming"
