"""Bus semantics, the same cases over the Redis bus and the in-process bus."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace

import pytest

from tests.helpers import async_wait_until
from tests.wire.bus.buses import BUS_KINDS, make_buses, uid
from wire.bus.base import LIVENESS_TTL
from wire.events import ChoiceDelta, Created, Delta, ErrorInfo, Event, EventType, Terminal
from wire.requests import GenerationRequest
from wire.sampling import Sampling
from wire.workers import WorkerInfo, WorkerState

pytestmark = pytest.mark.parametrize("kind", BUS_KINDS)

# A blocking read or poll long enough that "returned early" and "ran to its
# block" are seconds apart, however loaded the machine (the Redis bus caps
# one wait at 5 s, MAX_BLOCK_MS).
BLOCK_MS = 5000
# Returned well before BLOCK_MS: woken by the event, not by the timeout.
EARLY_S = 0.8 * BLOCK_MS / 1000
# The model every worker and request of one test names, fresh per test: a
# worker reclaims the unstarted requests of dead peers of its model, and
# earlier tests' workers (never deregistered) are dead peers of "m".
MODEL = "m"


@pytest.fixture(autouse=True)
def fresh_model():
    global MODEL
    MODEL = uid("m")


def _delta(seq: int, text: str) -> Delta:
    return Delta(seq, (ChoiceDelta(0, text, (seq,)),))


def _events(response_id: str, n_deltas: int, terminal: EventType | None) -> list[Event]:
    events: list[Event] = [
        Created(response_id=response_id, model=MODEL, worker_id="w", prompt_tokens=3)
    ]
    events += [_delta(seq, f"t{seq}") for seq in range(2, n_deltas + 2)]
    if terminal is not None:
        events.append(Terminal(terminal, n_deltas + 2))
    return events


def _request(response_id: str) -> GenerationRequest:
    return GenerationRequest(
        response_id=response_id,
        model=MODEL,
        prompt_token_ids=[1, 2, 3],
        sampling=Sampling(max_tokens=4, temperature=0.0, stop=("\n",)),
        tier="pro",
        tenant_id=7,
        cache_salt="salt",
    )


@pytest.mark.asyncio
async def test_events_arrive_in_order_and_resume_after_any_seq(kind):
    """Readers get every event in seq order; after_seq k returns exactly k+1.."""
    bus, worker_bus = make_buses(kind)
    rid = uid("resp")
    events = _events(rid, 4, EventType.COMPLETED)
    assert worker_bus.publish_many([(rid, e) for e in events]) == set()
    assert await bus.read_events(rid, 0, 0) == events
    for k in range(len(events) + 1):
        assert [e.seq for e in await bus.read_events(rid, k, 0)] == list(range(k + 1, 7))
    await bus.close()


@pytest.mark.asyncio
async def test_read_waits_for_the_first_event_and_returns_early(kind):
    """A blocking read returns as soon as the worker publishes, not at block_ms;
    block_ms=0 does not block at all (XREAD BLOCK 0 would wait forever)."""
    bus, worker_bus = make_buses(kind)
    rid = uid("resp")
    first = _events(rid, 0, None)[0]
    # The delay only lets the read start blocking before the event exists; a
    # late reader finds the event at once, and the assertions hold either way.
    timer = threading.Timer(0.3, worker_bus.publish, (rid, first))
    started = time.monotonic()
    timer.start()
    events = await bus.read_events(rid, 0, BLOCK_MS)
    assert events == [first]
    assert time.monotonic() - started < EARLY_S
    assert await asyncio.wait_for(bus.read_events(rid, 1, 0), timeout=30) == []
    await bus.close()


@pytest.mark.asyncio
async def test_submitted_requests_and_aborts_reach_the_worker_once(kind):
    """poll returns each request and abort exactly once, requests intact."""
    bus, worker_bus = make_buses(kind)
    wid, r1, r2 = uid("w"), uid("r1"), uid("r2")
    worker_bus.register(WorkerInfo(worker_id=wid, model=MODEL, state=WorkerState.READY))
    await bus.submit(wid, _request(r1))
    await bus.submit(wid, _request(r2))
    await bus.request_abort(wid, r1)
    requests, aborts = worker_bus.poll(wid, 1000)
    assert [r.response_id for r in requests] == [r1, r2]
    assert requests[0].sampling == Sampling(max_tokens=4, temperature=0.0, stop=("\n",))
    assert (requests[0].cache_salt, requests[0].tenant_id) == ("salt", 7)
    assert aborts == [r1]
    # "Nothing arrives within block_ms" is the behaviour here, so the poll's
    # own wait is measured: a lower bound, which a slow machine only exceeds.
    started = time.monotonic()
    assert worker_bus.poll(wid, 200) == ([], [])
    assert time.monotonic() - started >= 0.15
    await bus.close()


@pytest.mark.asyncio
async def test_poll_wakes_up_when_a_request_arrives(kind):
    """A worker blocked in poll sees a request submitted meanwhile at once."""
    bus, worker_bus = make_buses(kind)
    wid, rid = uid("w"), uid("r")
    worker_bus.register(WorkerInfo(worker_id=wid, model=MODEL, state=WorkerState.READY))
    got: list = []
    started = time.monotonic()
    poller = threading.Thread(target=lambda: got.append(worker_bus.poll(wid, BLOCK_MS)))
    poller.start()
    # Only lets the poller start blocking before the request exists; a late
    # poller finds the request at once, and the assertions hold either way.
    await asyncio.sleep(0.2)
    await bus.submit(wid, _request(rid))
    await asyncio.to_thread(poller.join, 30)
    assert got, "poll did not return"
    assert [r.response_id for r in got[0][0]] == [rid]
    assert time.monotonic() - started < EARLY_S
    await bus.close()


@pytest.mark.asyncio
async def test_register_discards_requests_left_by_an_earlier_incarnation(kind):
    """A restarted worker never runs requests whose streams were already failed."""
    bus, worker_bus = make_buses(kind)
    wid = uid("w")
    await bus.submit(wid, _request(uid("old")))
    worker_bus.register(WorkerInfo(worker_id=wid, model=MODEL, state=WorkerState.WARMING))
    assert worker_bus.poll(wid, 0) == ([], [])
    await bus.close()


@pytest.mark.asyncio
async def test_nothing_lands_after_a_terminal_event(kind):
    """Worker events after the terminal one are dropped and reported closed."""
    bus, worker_bus = make_buses(kind)
    rid = uid("resp")
    worker_bus.publish_many([(rid, e) for e in _events(rid, 1, EventType.COMPLETED)])
    late = Terminal(EventType.FAILED, 4, error=ErrorInfo("late"))
    assert worker_bus.publish_many([(rid, _delta(4, "x")), (rid, late)]) == {rid}
    assert not await bus.publish_if_open(rid, late)
    assert [e.type for e in await bus.read_events(rid, 0, 0)][-1] == "completed"
    await bus.close()


@pytest.mark.asyncio
async def test_publish_if_open_appends_one_terminal_with_the_next_seq(kind):
    """publish_if_open numbers the event itself and wins only once."""
    bus, worker_bus = make_buses(kind)
    rid = uid("resp")
    worker_bus.publish_many([(rid, e) for e in _events(rid, 2, None)])
    failed = Terminal(EventType.FAILED, 0, error=ErrorInfo("lost", code="worker_lost"))
    assert await bus.publish_if_open(rid, failed)
    assert not await bus.publish_if_open(rid, failed)
    events = await bus.read_events(rid, 0, 0)
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert events[-1] == replace(failed, seq=4)
    # The worker, still running, cannot add anything after it.
    assert worker_bus.publish(rid, _delta(4, "late")) is False
    await bus.close()


@pytest.mark.asyncio
async def test_publish_if_open_on_a_stream_nobody_wrote_starts_at_seq_1(kind):
    """A worker that died before ``created`` still gets a readable failed stream."""
    bus, _ = make_buses(kind)
    rid = uid("resp")
    assert await bus.publish_if_open(rid, Terminal(EventType.FAILED, 0))
    assert [(e.seq, e.type) for e in await bus.read_events(rid, 0, 0)] == [(1, "failed")]
    await bus.close()


@pytest.mark.asyncio
async def test_worker_finish_racing_publish_if_open_ends_exactly_once(kind):
    """Whoever wins, each stream has one terminal event and gapless seqs."""
    bus, worker_bus = make_buses(kind)
    rids = [uid("race") for _ in range(40)]
    go = threading.Barrier(2)

    def worker() -> None:
        go.wait()
        for i, rid in enumerate(rids):
            created, *rest = _events(rid, 3, EventType.COMPLETED)
            worker_bus.publish(rid, created)
            # Delays from 0 to 2 ms sweep the finish across the web tier's call.
            time.sleep(i * 0.00005)
            worker_bus.publish_many([(rid, e) for e in rest])

    thread = threading.Thread(target=worker)
    thread.start()
    await asyncio.to_thread(go.wait)
    wins = 0
    for rid in rids:
        # Fire as soon as the worker has started this stream, so the two
        # writers meet mid-stream rather than one after the other.
        assert await bus.read_events(rid, 0, 5000)
        wins += await bus.publish_if_open(rid, Terminal(EventType.FAILED, 0))
    await asyncio.to_thread(thread.join, 30)
    terminal_types = []
    for rid in rids:
        events = await bus.read_events(rid, 0, 0)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        terminals = [e.type for e in events if e.type in ("completed", "failed")]
        assert len(terminals) == 1
        terminal_types.append(terminals[0])
    assert terminal_types.count("failed") == wins
    await bus.close()


@pytest.mark.asyncio
async def test_finished_streams_expire_after_the_response_ttl(kind):
    """A finished stream stays readable for resumes, then goes away once the
    response TTL has passed (not before); an open stream is kept meanwhile."""
    ttl = 2
    bus, worker_bus = make_buses(kind, response_ttl=ttl)
    rid, open_rid = uid("resp"), uid("open")
    finished = time.monotonic()
    worker_bus.publish_many([(rid, e) for e in _events(rid, 1, EventType.COMPLETED)])
    worker_bus.publish_many([(open_rid, e) for e in _events(open_rid, 1, None)])
    assert len(await bus.read_events(rid, 0, 0)) == 3

    async def expired() -> bool:
        return await bus.read_events(rid, 0, 0) == []

    await async_wait_until(expired, timeout=30, message="finished stream expiry")
    # Expiry is relative to the finish: never earlier than the TTL (50 ms for
    # the server clock's rounding), however late we looked.
    assert time.monotonic() - finished >= ttl - 0.05
    # An open stream is kept much longer than the finished-response TTL.
    assert len(await bus.read_events(open_rid, 0, 0)) == 2
    await bus.close()


@pytest.mark.asyncio
async def test_workers_without_heartbeat_leave_the_registry(kind):
    """list_workers shows live workers only: a deregistered one goes at once, one
    that stopped (no heartbeat, no liveness refresh) once its liveness key's
    TTL has passed (not before, and well before the heartbeat TTL); one that
    keeps beating stays, with the state of its latest beat."""
    ttl = 2
    bus, worker_bus = make_buses(kind, heartbeat_ttl=ttl)
    alive, dead, gone = uid("alive"), uid("dead"), uid("gone")
    registered = time.monotonic()
    for wid in (alive, dead, gone):
        worker_bus.register(WorkerInfo(worker_id=wid, model=MODEL, state=WorkerState.READY))
    worker_bus.deregister(gone)
    assert {alive, dead} <= {w.worker_id for w in await bus.list_workers()}
    assert gone not in {w.worker_id for w in await bus.list_workers()}
    beat = WorkerInfo(worker_id=alive, model=MODEL, state=WorkerState.DRAINING)

    async def dead_forgotten() -> bool:
        # ``alive`` beats on every poll, far more often than its TTLs.
        worker_bus.heartbeat(beat)
        worker_bus.liveness(alive)
        return dead not in {w.worker_id for w in await bus.list_workers()}

    await async_wait_until(dead_forgotten, timeout=30, interval=0.1, message="dead worker")
    # Never dropped before its TTL (50 ms for the server clock's rounding).
    assert time.monotonic() - registered >= LIVENESS_TTL - 0.05
    worker_bus.heartbeat(beat)
    worker_bus.liveness(alive)
    workers = {w.worker_id: w for w in await bus.list_workers()}
    assert alive in workers and dead not in workers
    assert workers[alive].state == WorkerState.DRAINING
    assert await bus.worker_alive(alive) and not await bus.worker_alive(dead)
    await bus.close()
