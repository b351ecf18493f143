"""dispatch: routing to ready workers and streams that always end, over both buses.

Workers here are registry entries driven by hand (register, heartbeat,
publish), so each failure mode can be staged exactly; the loop with the real
engine is covered in tests/gpuworkers/.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest

from inference.relay.dispatch import (
    DEATH_CONFIRM_SECONDS,
    POLL_MS,
    ModelWarmingUp,
    NoWorkerAvailable,
    cancel_request,
    dispatch_request,
    stream_events,
)
from tests.wire.bus.buses import BUS_KINDS, UNREACHABLE_REDIS_URL, make_buses, uid
from wire.bus import BusUnavailable
from wire.bus.base import LIVENESS_INTERVAL
from wire.bus.redis_bus import RedisBus
from wire.events import ChoiceDelta, Created, Delta, EventType, Terminal
from wire.requests import GenerationRequest
from wire.sampling import Sampling
from wire.workers import WorkerInfo
from wire.workers import WorkerState as S

pytestmark = pytest.mark.asyncio


@pytest.fixture(autouse=True)
def no_embedded_engine(settings):
    settings.EMBEDDED_ENGINE = False


def _request(model: str, n_prompt: int = 3) -> GenerationRequest:
    return GenerationRequest(
        response_id=uid("resp"), model=model, prompt_token_ids=[1] * n_prompt, sampling=Sampling()
    )


def _worker(model: str, state: S = S.READY, **load) -> WorkerInfo:
    return WorkerInfo(worker_id=uid("w"), model=model, state=state, **load)


@contextlib.contextmanager
def _refreshing(worker_bus, worker_id: str):
    """A live worker's liveness refresher (gpuworkers.heartbeat's), in a thread."""
    stop = threading.Event()

    def refresh() -> None:
        while not stop.wait(LIVENESS_INTERVAL):
            worker_bus.liveness(worker_id)

    thread = threading.Thread(target=refresh, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


@pytest.mark.parametrize("kind", BUS_KINDS)
async def test_dispatch_picks_the_least_loaded_ready_worker_of_the_model(kind):
    """WARMING, DRAINING and other models' workers are skipped; load decides."""
    bus, worker_bus = make_buses(kind)
    model = uid("model")
    busy = _worker(model, running=6, waiting=2, queued_tokens=900)
    idle = _worker(model, running=1)
    full = _worker(model, running=0, kv_blocks_used=99, kv_blocks_total=100)
    others = [_worker(model, S.WARMING), _worker(model, S.DRAINING), _worker(uid("other"))]
    for info in [busy, idle, full, *others]:
        worker_bus.register(info)
    request = _request(model)
    chosen = await dispatch_request(request, bus=bus)
    assert chosen.worker_id == idle.worker_id
    requests, _ = worker_bus.poll(idle.worker_id, 1000)
    assert [r.response_id for r in requests] == [request.response_id]
    await bus.close()


@pytest.mark.parametrize("kind", BUS_KINDS)
async def test_a_burst_between_heartbeats_spreads_over_workers(kind, settings):
    """Requests sent since the last heartbeat count as load, so a burst is shared.

    Under the least-loaded policy; the cache-aware router's queue threshold
    counts them the same way (tests/fleet).
    """
    settings.FLEET_ROUTING_POLICY = "least_loaded"
    bus, worker_bus = make_buses(kind)
    model = uid("model")
    workers = [_worker(model), _worker(model)]
    for info in workers:
        worker_bus.register(info)
    chosen = [(await dispatch_request(_request(model), bus=bus)).worker_id for _ in range(6)]
    assert sorted(chosen.count(w.worker_id) for w in workers) == [3, 3]
    await bus.close()


@pytest.mark.parametrize("kind", BUS_KINDS)
async def test_no_ready_worker_for_the_model_raises(kind):
    """No worker at all: NoWorkerAvailable; only warming ones: ModelWarmingUp,
    which says so and when to retry (both are 503s)."""
    bus, worker_bus = make_buses(kind)
    model = uid("model")
    with pytest.raises(NoWorkerAvailable) as none:
        await dispatch_request(_request(model), bus=bus)
    assert not isinstance(none.value, ModelWarmingUp)
    worker_bus.register(_worker(model, S.WARMING))
    with pytest.raises(ModelWarmingUp, match=f"'{model}' is warming up") as warming:
        await dispatch_request(_request(model), bus=bus)
    assert warming.value.retry_after > 0
    await bus.close()


@pytest.mark.parametrize("kind", BUS_KINDS)
async def test_stream_events_ends_at_the_terminal_event_and_resumes(kind):
    """Events through the terminal one, nothing after; after_seq resumes exactly."""
    bus, worker_bus = make_buses(kind)
    info, rid = _worker("m"), uid("resp")
    worker_bus.register(info)
    choice = ChoiceDelta(0, "hi", (5,))
    events = [
        Created(response_id=rid, model="m", worker_id=info.worker_id, prompt_tokens=2),
        Delta(2, (choice,)),
        Terminal(EventType.COMPLETED, 3),
    ]
    threading.Timer(0.2, worker_bus.publish_many, ([(rid, e) for e in events],)).start()
    got = [e async for e in stream_events(rid, worker_id=info.worker_id, bus=bus)]
    assert got == events
    resumed = [e async for e in stream_events(rid, worker_id=info.worker_id, bus=bus, after_seq=1)]
    assert resumed == events[1:]
    await bus.close()


@pytest.mark.parametrize("kind", BUS_KINDS)
async def test_a_lost_worker_ends_the_stream_failed_within_seconds(kind):
    """No heartbeat: failed/worker_lost, written to the stream with the usage so far."""
    bus, worker_bus = make_buses(kind, heartbeat_ttl=1)
    info, rid = _worker("m"), uid("resp")
    worker_bus.register(info)
    choice = ChoiceDelta(0, "a", (5, 6))
    worker_bus.publish(
        rid, Created(response_id=rid, model="m", worker_id=info.worker_id, prompt_tokens=4)
    )
    worker_bus.publish(rid, Delta(2, (choice,)))
    started = time.monotonic()
    got = [e async for e in stream_events(rid, worker_id=info.worker_id, bus=bus)]
    assert time.monotonic() - started < 5
    assert [e.type for e in got] == ["created", "delta", "failed"]
    failed = got[-1]
    assert failed.seq == 3
    assert failed.error.code == "worker_lost"
    assert failed.error.message == "The worker serving this request was lost"
    assert failed.usage.prompt_tokens == 4 and failed.usage.completion_tokens == 2
    # A resuming client sees the same ending; a late worker event is refused.
    assert (await bus.read_events(rid, 2, 0)) == [failed]
    assert worker_bus.publish(rid, Delta(3, (choice,))) is False
    await bus.close()


@pytest.mark.parametrize("kind", BUS_KINDS)
async def test_a_stream_without_progress_times_out_and_aborts(kind):
    """A live worker that never answers: abort sent, failed/stream_timeout."""
    bus, worker_bus = make_buses(kind)
    info, rid = _worker("m"), uid("resp")
    worker_bus.register(info)
    with _refreshing(worker_bus, info.worker_id):
        got = [
            e async for e in stream_events(rid, worker_id=info.worker_id, bus=bus, idle_timeout=1)
        ]
    assert [(e.type, e.error.code) for e in got] == [("failed", "stream_timeout")]
    assert worker_bus.poll(info.worker_id, 0)[1] == [rid]
    await bus.close()


@pytest.mark.parametrize("kind", BUS_KINDS)
async def test_one_missed_liveness_window_does_not_fail_the_stream(kind):
    """The first liveness check finds the worker missing (as after a Redis
    stall that ran its refresh late, or a starved refresher); the second
    look a refresh interval later finds it back, and the stream goes on to
    its own ending instead of failing worker_lost."""
    bus, worker_bus = make_buses(kind)
    info, rid = _worker("m"), uid("resp")
    worker_bus.register(info)
    looks: list[bool] = []
    real_alive = bus.worker_alive

    async def worker_alive(worker_id: str) -> bool:
        alive = await real_alive(worker_id) and bool(looks)
        looks.append(alive)
        return alive

    bus.worker_alive = worker_alive
    choice = ChoiceDelta(0, "a", (5,))
    worker_bus.publish(
        rid, Created(response_id=rid, model="m", worker_id=info.worker_id, prompt_tokens=4)
    )
    worker_bus.publish(rid, Delta(2, (choice,)))

    async def finish_later() -> None:
        # Quiet for two polls: the relay checks, and misses the worker once.
        await asyncio.sleep(2 * POLL_MS / 1000 + DEATH_CONFIRM_SECONDS)
        worker_bus.publish(rid, Terminal(EventType.COMPLETED, 3))

    with _refreshing(worker_bus, info.worker_id):
        finisher = asyncio.create_task(finish_later())
        got = [e async for e in stream_events(rid, worker_id=info.worker_id, bus=bus)]
        await finisher
    assert looks[:2] == [False, True]
    assert [e.type for e in got] == ["created", "delta", "completed"]
    await bus.close()


@pytest.mark.parametrize("kind", BUS_KINDS)
async def test_cancel_request_reaches_the_worker(kind):
    """cancel_request puts the response id on the worker's abort channel."""
    bus, worker_bus = make_buses(kind)
    info, rid = _worker("m"), uid("resp")
    worker_bus.register(info)
    await cancel_request(rid, worker_id=info.worker_id, bus=bus)
    assert worker_bus.poll(info.worker_id, 1000) == ([], [rid])
    await bus.close()


async def test_unreachable_redis_fails_dispatch_and_ends_streams():
    """BusUnavailable from dispatch (503); an open stream ends failed/bus_unavailable."""
    bus = RedisBus(UNREACHABLE_REDIS_URL)
    with pytest.raises(BusUnavailable):
        await dispatch_request(_request("m"), bus=bus)
    with pytest.raises(BusUnavailable):
        await cancel_request("r", worker_id="w", bus=bus)
    started = time.monotonic()
    got = [e async for e in stream_events("r", worker_id="w", bus=bus, after_seq=4)]
    assert time.monotonic() - started < 10
    assert [(e.type, e.seq, e.error.code) for e in got] == [("failed", 5, "bus_unavailable")]
    await bus.close()
