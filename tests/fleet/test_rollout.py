"""Canary rollouts driven by a real Celery worker against real serving workers.

Two versions of the demo model serve from the in-process bus; the client
population dispatches through the published snapshot and records usage as
the relay does. The broken canary is a real misconfiguration that warm-up
does not reveal: once serving, its engine caps a request at one KV block,
so every real prompt fails on it.
"""

from __future__ import annotations

import threading
import time

import pytest
from celery.contrib.testing.worker import start_worker

from config.celery_app import app as celery_app
from fleet.models import Deployment, Rollout
from fleet.snapshot import snapshot_current
from fleet.tasks import rollout_begin
from gpuworkers.engine import LLMEngine
from gpuworkers.engine.convert_gguf import ensure_demo_model
from gpuworkers.worker import WorkerLoop
from tests.fleet.traffic import Traffic
from tests.helpers import wait_until
from tests.plugins.engine import MODEL
from tests.redis_helpers import celery_test_url
from tests.wire.bus.buses import uid
from wire.bus.memory_bus import MemoryBus

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# TTFT on two CPU cores shared by two engines and the test is noise; the
# guardrail under test is the error rate (TTFT is covered in test_guardrails).
GUARDRAILS = {"min_requests": 3, "min_breach_requests": 3, "ttft_p95_ratio": 50.0}


def broker_url() -> str:
    # The billing tests' broker: Celery caches its producer pool and result
    # backend on first use, so one process must not switch brokers.
    return celery_test_url()


@pytest.fixture(autouse=True)
def no_embedded_engine(settings):
    settings.EMBEDDED_ENGINE = False


@pytest.fixture
def celery_worker():
    celery_app.conf.update(broker_url=broker_url(), result_backend=broker_url())
    with start_worker(
        celery_app, pool="solo", queues=["fleet"], perform_ping_check=False, loglevel="WARNING"
    ):
        yield


def _engine(**options) -> LLMEngine:
    return LLMEngine.from_pretrained(
        ensure_demo_model(),
        dtype="bfloat16",
        kv_cache_bytes=32 << 20,
        max_num_batched_tokens=128,
        model_id=MODEL,
        **options,
    )


@pytest.fixture(scope="module")
def canary_engines() -> dict[str, LLMEngine]:
    return {"healthy": _engine(), "broken": _engine()}


@pytest.fixture
def serve_version():
    loops: list[tuple[WorkerLoop, threading.Thread]] = []

    def start(engine, bus, version: str) -> WorkerLoop:
        loop = WorkerLoop(engine, bus, uid(f"worker-{version}"), MODEL, version=version)
        thread = threading.Thread(target=loop.run, daemon=True)
        thread.start()
        assert loop.ready.wait(60)
        loops.append((loop, thread))
        return loop

    yield start
    for loop, thread in loops:
        loop.request_stop()
        thread.join(30)


def _wait_until_finished(rollout_id: int, traffic: Traffic, timeout: float = 90) -> Rollout:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rollout = Rollout.objects.get(pk=rollout_id)
        if rollout.state != Rollout.State.RAMPING:
            return rollout
        assert not traffic.errors, traffic.errors[:3]
        time.sleep(0.3)
    results = Rollout.objects.get(pk=rollout_id).results
    pytest.fail(f"rollout still ramping after {len(results)} checks: {results[-1:]}")


def _after(traffic: Traffic, count: int, timeout: float = 60) -> list[tuple[str, str, str]]:
    """At least ``count`` results, all of requests dispatched under the final snapshot.

    Fenced, not timed: first this process must route by the final snapshot
    (the rollout's outcome is published on commit, a moment after its state
    is saved); then ``traffic`` stops, so every request an older snapshot
    routed has finished; then a fresh population runs until ``count`` of its
    requests are done. Its results and errors are added to ``traffic``'s.
    """

    def final_snapshot_in_effect() -> bool:
        snapshot = snapshot_current(max_age=0)
        if snapshot is None or snapshot.rollout_of(traffic.model) is not None:
            return False
        rows = Deployment.objects.filter(model_name=traffic.model).exclude(
            state=Deployment.State.RETIRED
        )
        published = {d.version: d.traffic_weight for d in snapshot.deployments_of(traffic.model)}
        return published == dict(rows.values_list("version", "traffic_weight"))

    wait_until(final_snapshot_in_effect, timeout=timeout, message="final snapshot in effect")
    traffic.stop()
    fresh = Traffic(
        traffic.bus,
        traffic.model,
        traffic.tenant_id,
        traffic.prompt,
        concurrency=traffic.concurrency,
    ).start()
    try:
        wait_until(
            lambda: len(fresh.results) >= count,
            timeout=timeout,
            interval=0.2,
            message=f"{count} requests under the final snapshot",
        )
    finally:
        fresh.stop()
        traffic.results.extend(fresh.results)
        traffic.errors.extend(fresh.errors)
    return list(fresh.results)


def _setup(
    bus,
    engine,
    canary_engine,
    serve_version,
    tenant_factory,
    prompt_ids,
    settings,
    broken=None,
    shadow_allowed=False,
):
    from fleet import services

    settings.FLEET_SNAPSHOT_REFRESH = 0.1
    services.deployment_register(model_name=MODEL, version="v1")
    services.deployment_register(model_name=MODEL, version="v2")
    serve_version(engine, bus, "v1")
    serve_version(canary_engine, bus, "v2")
    if canary_engine is broken:
        canary_engine.config.max_blocks_per_request = 1
    prompt = prompt_ids("Name one colour of the rainbow.")
    assert len(prompt) > 16  # longer than the broken canary's one-block cap
    tenant = tenant_factory()
    if shadow_allowed:
        tenant.shadow_opt_in = True
        tenant.save(update_fields=["shadow_opt_in"])
    traffic = Traffic(bus, MODEL, tenant.pk, prompt, concurrency=4, shadow_allowed=shadow_allowed)
    return traffic.start()


def test_a_healthy_canary_ramps_to_all_traffic(
    celery_worker, engine, canary_engines, serve_version, tenant_factory, prompt_ids, settings
):
    """Every step passes its guardrails: v2 ends with all the weight, v1 on warm
    standby, and every request dispatched afterwards is served by v2."""
    bus = MemoryBus()
    traffic = _setup(
        bus, engine, canary_engines["healthy"], serve_version, tenant_factory, prompt_ids, settings
    )
    try:
        rollout_id = rollout_begin.delay(
            model_name=MODEL,
            canary_version="v2",
            steps=[25, 50, 100],
            dwell_seconds=0.5,
            guardrails=GUARDRAILS,
        ).get(timeout=30)
        rollout = _wait_until_finished(rollout_id, traffic)
        assert rollout.state == Rollout.State.COMPLETED, rollout.reason
        assert [r["percent"] for r in rollout.results if r["passed"]] == [25, 50, 100]
        weights = dict(Deployment.objects.values_list("version", "traffic_weight"))
        assert weights == {"v1": 0, "v2": 100}
        assert Deployment.objects.get(version="v1").state == Deployment.State.WARM_STANDBY
        later = _after(traffic, 8)
    finally:
        traffic.stop()
    assert {version for version, _, _ in later} == {"v2"}
    assert {status for _, status, _ in traffic.results} == {"completed"}


def test_a_canary_failing_its_guardrail_is_rolled_back_without_failing_stable_requests(
    celery_worker, engine, canary_engines, serve_version, tenant_factory, prompt_ids, settings
):
    """A canary whose requests fail breaches the error-rate guardrail: rolled back
    to v1 with all the weight; v1 never failed a request, and every request
    dispatched afterwards is served by v1."""
    bus = MemoryBus()
    broken = canary_engines["broken"]
    traffic = _setup(
        bus, engine, broken, serve_version, tenant_factory, prompt_ids, settings, broken
    )
    try:
        rollout_id = rollout_begin.delay(
            model_name=MODEL,
            canary_version="v2",
            steps=[25, 50, 100],
            dwell_seconds=0.5,
            guardrails=GUARDRAILS,
        ).get(timeout=30)
        rollout = _wait_until_finished(rollout_id, traffic)
        assert rollout.state == Rollout.State.ROLLED_BACK
        assert "error_rate" in rollout.reason
        weights = dict(Deployment.objects.values_list("version", "traffic_weight"))
        assert weights == {"v1": 100, "v2": 0}
        later = _after(traffic, 12)
    finally:
        traffic.stop()
    assert not traffic.errors
    # Traffic is back on stable, and the stable path never failed a request.
    assert {(version, status) for version, status, _ in later} == {("v1", "completed")}
    stable = [status for version, status, _ in traffic.results if version == "v1"]
    assert stable and set(stable) == {"completed"}
    assert "failed" in {status for version, status, _ in traffic.results if version == "v2"}


def test_shadow_mode_runs_stable_requests_on_the_canary_too_and_keeps_both_outputs(
    engine, canary_engines, serve_version, tenant_factory, prompt_ids, settings
):
    from billing.models import UsageRecord
    from fleet import services
    from fleet.models import ShadowComparison

    bus = MemoryBus()
    traffic = _setup(
        bus,
        engine,
        canary_engines["healthy"],
        serve_version,
        tenant_factory,
        prompt_ids,
        settings,
        shadow_allowed=True,
    )
    try:
        # Nobody advances it: the canary keeps 1% of traffic, and shadows the rest.
        rollout = services.rollout_start(
            model_name=MODEL, canary_version="v2", steps=[1, 100], shadow_share=1.0
        )
        deadline = time.monotonic() + 60
        while ShadowComparison.objects.count() < 3 and time.monotonic() < deadline:
            time.sleep(0.3)
    finally:
        traffic.stop()
    pairs = list(ShadowComparison.objects.filter(rollout=rollout))
    assert len(pairs) >= 3
    assert {pair.tenant_id for pair in pairs} == {traffic.tenant_id}
    for pair in pairs:
        assert (pair.stable_version, pair.canary_version) == ("v1", "v2")
        assert pair.stable_status == pair.canary_status == "completed"
        assert pair.stable_text and pair.canary_text
        assert pair.identical == (pair.stable_text == pair.canary_text)
    # Shadow responses reach no user and bill nothing.
    assert not UsageRecord.objects.filter(response_id__startswith="shadow-").exists()
    shown = {r.response_id for r in UsageRecord.objects.all()}
    assert {p.response_id for p in pairs} <= shown
    assert not {p.shadow_response_id for p in pairs} & shown
