"""Requests of a worker that died before starting them go to a peer, once.

The dead worker is a bare bus consumer that takes a request and stops (no
liveness refresh, as after SIGKILL); the survivor is a real ``WorkerLoop``
with the demo engine. Each test has a model name of its own, so peers left
by other tests on the same Redis database are not its peers.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gpuworkers.worker import WorkerLoop
from inference.relay.dispatch import stream_events
from tests.wire.bus.buses import BUS_KINDS, make_buses, redis_test_url, uid
from wire.bus.base import LIVENESS_TTL
from wire.bus.redis_bus import RedisWorkerBus
from wire.events import ChoiceDelta, Created, Delta
from wire.requests import GenerationRequest
from wire.sampling import Sampling
from wire.workers import WorkerInfo, WorkerState

pytestmark = pytest.mark.asyncio


def _peer_bus(kind: str, shared):
    """Another process's worker bus (Redis), or the one in-process bus."""
    return RedisWorkerBus(redis_test_url()) if kind == "redis" else shared


def _doomed(bus, model: str) -> str:
    info = WorkerInfo(worker_id=uid("doomed"), model=model, state=WorkerState.READY)
    bus.register(info)
    return info.worker_id


def _request(model: str, prompt: list[int], **sampling) -> GenerationRequest:
    sampling = {"max_tokens": 6, "temperature": 0.0, **sampling}
    return GenerationRequest(
        response_id=uid("resp"), model=model, prompt_token_ids=prompt, sampling=Sampling(**sampling)
    )


@pytest.mark.parametrize("kind", BUS_KINDS)
async def test_an_unstarted_request_of_a_dead_worker_is_served_by_a_peer(kind, engine, prompt_ids):
    """The client sees one normal completion, from the survivor, numbered 1..n."""
    model = uid("model")
    bus, worker_bus = make_buses(kind)
    dead_bus = _peer_bus(kind, worker_bus)
    dead = _doomed(dead_bus, model)
    survivor = WorkerLoop(engine, worker_bus, uid("survivor"), model)
    thread = threading.Thread(target=survivor.run, daemon=True)
    thread.start()
    try:
        assert survivor.ready.wait(60)
        request = _request(model, prompt_ids("Say hi."))
        await bus.submit(dead, request)
        taken, _ = await asyncio.to_thread(dead_bus.poll, dead, 1000)
        assert [r.response_id for r in taken] == [request.response_id]
        # ... and the doomed worker dies holding it (never acks, never refreshes).
        events = [e async for e in stream_events(request.response_id, worker_id=dead, bus=bus)]
    finally:
        survivor.request_stop()
        thread.join(30)
    types = [e.type for e in events]
    assert types[0] == "created" and types[-1] == "completed", events[-1]
    assert types.count("created") == 1 and types.count("completed") == 1
    assert events[0].worker_id == survivor.worker_id
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[-1].usage.completion_tokens == 6
    await bus.close()


@pytest.mark.parametrize("kind", BUS_KINDS)
async def test_a_request_that_outlives_its_retry_budget_fails_explicitly(kind):
    """Two workers die holding it: the third does not run it; the stream says why."""
    model = uid("model")
    bus, worker_bus = make_buses(kind)
    request = _request(model, [1, 2, 3])
    first = _doomed(worker_bus, model)
    await bus.submit(first, request)
    assert [r.response_id for r in worker_bus.poll(first, 1000)[0]] == [request.response_id]
    second_bus = _peer_bus(kind, worker_bus)
    second = _doomed(second_bus, model)
    third_bus = _peer_bus(kind, worker_bus)
    third = _doomed(third_bus, model)

    def take(bus_, worker_id) -> list[GenerationRequest]:
        """Poll as a live worker until something comes (or 10 s pass)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            bus_.liveness(worker_id)
            taken = bus_.poll(worker_id, 200)[0]
            if taken:
                return taken
        return []

    # The first dies; the second reclaims it (second delivery), then dies too.
    assert [r.response_id for r in await asyncio.to_thread(take, second_bus, second)] == [
        request.response_id
    ]
    await asyncio.sleep(LIVENESS_TTL + 0.2)
    # The third finds it past the budget: it fails it and runs nothing.
    assert await asyncio.to_thread(take, third_bus, third) == []
    events = [e async for e in stream_events(request.response_id, worker_id=first, bus=bus)]
    assert [e.type for e in events] == ["failed"]
    error = events[0].error
    assert error.code == "worker_lost" and "retry budget" in error.message
    await bus.close()


@pytest.mark.parametrize("kind", BUS_KINDS)
async def test_a_started_request_of_a_dead_worker_is_never_replayed(kind):
    """It had streamed a token: the stream fails (worker_lost) and no peer runs it."""
    model = uid("model")
    bus, worker_bus = make_buses(kind)
    dead = _doomed(worker_bus, model)
    request = _request(model, [1, 2, 3])
    await bus.submit(dead, request)
    assert worker_bus.poll(dead, 1000)[0]
    rid = request.response_id
    choice = ChoiceDelta(0, "a", (5,))
    worker_bus.publish_many(
        [
            (rid, Created(response_id=rid, model=model, worker_id=dead, prompt_tokens=3)),
            (rid, Delta(2, (choice,))),
        ]
    )
    peer_bus = _peer_bus(kind, worker_bus)
    peer = _doomed(peer_bus, model)
    started = time.monotonic()
    reader = asyncio.ensure_future(_collect(bus, rid, dead))
    taken = []
    while not reader.done():
        peer_bus.liveness(peer)
        taken += (await asyncio.to_thread(peer_bus.poll, peer, 200))[0]
    events = reader.result()
    assert time.monotonic() - started < 3 + LIVENESS_TTL
    assert [e.type for e in events] == ["created", "delta", "failed"]
    assert events[-1].error.code == "worker_lost"
    assert taken == []
    await bus.close()


async def _collect(bus, response_id: str, worker_id: str) -> list[dict]:
    return [e async for e in stream_events(response_id, worker_id=worker_id, bus=bus)]


@pytest.mark.parametrize("kind", BUS_KINDS)
async def test_a_long_engine_step_does_not_look_like_death(
    kind, engine, serve, prompt_ids, monkeypatch
):
    """A step of twice the liveness TTL: the stream completes, nobody declares loss."""
    bus, worker_bus = make_buses(kind)
    loop = serve(worker_bus)
    real_step = engine.step
    slow = {"left": 1}

    def step():
        if slow["left"]:
            slow["left"] -= 1
            time.sleep(2 * LIVENESS_TTL)
        return real_step()

    monkeypatch.setattr(engine, "step", step)
    request = _request("demo-test", prompt_ids("Hi"))
    await bus.submit(loop.worker_id, request)
    events = await _collect(bus, request.response_id, loop.worker_id)
    assert slow["left"] == 0
    assert events[-1].type == "completed", events[-1]
    assert events[0].worker_id == loop.worker_id
    await bus.close()
