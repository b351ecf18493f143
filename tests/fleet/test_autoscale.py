"""The autoscaling signal: queue age and admitted tokens, warm-up aware."""

from __future__ import annotations

import time

import pytest

from fleet import autoscale
from fleet.autoscale import scale_signal
from wire.snapshot import DeploymentSpec, RoutingThresholds, Snapshot
from wire.workers import WorkerInfo, WorkerState


@pytest.fixture(autouse=True)
def fresh_trend():
    autoscale._history.clear()


def snapshot(**routing) -> Snapshot:
    return Snapshot(
        version=1,
        published_at=time.time(),
        routing=RoutingThresholds(**routing),
        deployments=(DeploymentSpec("m", "v1", "", 1, 100, 1.0, 90, "active"),),
    )


def worker(wid, *, state=WorkerState.READY, blocks=0, queued=0, age=0.0):
    return WorkerInfo(
        worker_id=wid,
        model="m",
        state=state,
        kv_blocks_used=blocks,
        kv_blocks_total=1000,
        queued_tokens=queued,
        extra={"block_size": 16, "queue_age_seconds": age},
    )


def test_an_idle_fleet_holds_at_the_deployment_floor():
    signal = scale_signal(model="m", workers=[worker("a")], snapshot=snapshot(), now=1000.0)
    assert signal.action == "hold" and signal.desired_replicas == 1
    assert signal.warmup_seconds == 90


def test_old_queued_requests_ask_for_more_replicas():
    workers = [worker("a", age=5.0), worker("b", age=1.0)]
    signal = scale_signal(
        model="m", workers=workers, snapshot=snapshot(max_queue_age_seconds=2.0), now=1000.0
    )
    assert signal.action == "scale_up" and signal.desired_replicas == 4
    assert signal.queue_age_seconds == 5.0 and "waited" in signal.reasons[0]


def test_admitted_tokens_projected_over_warm_up_and_warming_replicas_count():
    limits = snapshot(target_tokens_per_replica=1000)
    scale_signal(model="m", workers=[worker("a", blocks=50)], snapshot=limits, now=1000.0)
    # 800 -> 1600 admitted tokens in 10 s: +80 tokens/s, 90 s of warm-up ahead.
    later = scale_signal(model="m", workers=[worker("a", blocks=100)], snapshot=limits, now=1010.0)
    assert later.admitted_tokens == 1600 and later.forecast_tokens == 1600 + 7200
    assert later.desired_replicas == 9 and later.delta == 8
    warming = [worker("a", blocks=100)] + [
        worker(f"w{i}", state=WorkerState.WARMING) for i in range(8)
    ]
    covered = scale_signal(model="m", workers=warming, snapshot=limits, now=1011.0)
    assert covered.warming == 8 and covered.delta <= 0


def test_the_warm_reserve_is_added_on_top():
    signal = scale_signal(
        model="m", workers=[worker("a")], snapshot=snapshot(warm_reserve=1), now=1.0
    )
    assert signal.desired_replicas == 2 and signal.action == "scale_up"
