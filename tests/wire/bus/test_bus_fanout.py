"""The web bus's shared reader (wire/bus/redis_bus/fanout.py), on real Redis.

Blocking ``read_events`` calls of every open response share one XREAD; the
contract tests (test_bus.py) hold over it, and these check what it adds:
one XREAD per batch rather than per event, prompt joins, resumes from
before its buffer, streams leaving it, Redis dying and coming back, and a
clean ``close()``. The ones that count commands or kill the server use a
redis-server of their own.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time

import pytest
import redis

from tests.helpers import async_wait_until
from tests.private_redis import PrivateRedis
from tests.wire.bus.buses import needs_redis, redis_test_url, uid
from wire.bus import BusUnavailable
from wire.bus.base import iterate_events
from wire.bus.redis_bus import RedisBus, RedisWorkerBus, stream_key
from wire.bus.redis_bus import fanout as fanout_module
from wire.events import ChoiceDelta, Created, Delta, Event, EventType, Terminal

BLOCK_MS = 5000


def _events(response_id: str, n_deltas: int, *, terminal: bool = True) -> list[Event]:
    events: list[Event] = [
        Created(response_id=response_id, model="m", worker_id="w", prompt_tokens=1)
    ]
    for seq in range(2, n_deltas + 2):
        events.append(Delta(seq, (ChoiceDelta(0, f"t{seq}", (seq,)),)))
    if terminal:
        events.append(Terminal(EventType.COMPLETED, n_deltas + 2))
    return events


@pytest.fixture
def private_redis():
    if not shutil.which("redis-server"):
        pytest.skip("no redis-server binary")
    server = PrivateRedis()
    server.start()
    yield server
    server.kill()


def _fanout_tasks() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("bus fan-out")]


@pytest.mark.asyncio
async def test_hundreds_of_streams_are_read_through_one_xread(private_redis):
    """300 streams, each event published in rounds as a worker's decode steps
    would: every reader gets its events in order, and the web side issues
    about one XREAD per round, not one per event."""
    n_streams, n_deltas = 300, 6
    bus, worker_bus = RedisBus(private_redis.url), RedisWorkerBus(private_redis.url)
    rids = [uid("many") for _ in range(n_streams)]
    expected = {rid: _events(rid, n_deltas) for rid in rids}
    readers = [
        asyncio.create_task(_collect(bus, rid)) for rid in rids
    ]  # fmt: skip
    await async_wait_until(lambda: len(bus._fanout._streams) == n_streams, message="joins")
    before = private_redis.command_calls("xread")
    reader_tasks_seen = set()

    def publish() -> None:
        for step in range(n_deltas + 2):
            worker_bus.publish_many([(rid, expected[rid][step]) for rid in rids])
            time.sleep(0.05)

    publisher = asyncio.create_task(asyncio.to_thread(publish))
    while not publisher.done():
        reader_tasks_seen.update(_fanout_tasks())
        await asyncio.sleep(0.01)
    got = await asyncio.wait_for(asyncio.gather(*readers), 60)
    xreads = private_redis.command_calls("xread") - before
    assert got == [expected[rid] for rid in rids]
    total_events = n_streams * (n_deltas + 2)
    # A few XREADs per round (8 rounds; Redis answers the blocked XREAD
    # after the first append of a batch, then the rest); the old read per
    # event was 2400 of them.
    assert xreads <= total_events // 20, (xreads, total_events)
    assert len(reader_tasks_seen) == 1
    await bus.close()


async def _collect(bus: RedisBus, rid: str) -> list[dict]:
    return [event async for event in iterate_events(bus, rid, 0, BLOCK_MS)]


@needs_redis
@pytest.mark.asyncio
async def test_a_stream_joining_a_blocked_read_is_served_at_once(monkeypatch):
    """The shared XREAD, blocked over stream A, is woken when stream B joins:
    B's first event comes long before that XREAD's own timeout. One wake per
    join; B's later tokens need none."""
    monkeypatch.setattr(fanout_module, "SHARED_BLOCK_MS", BLOCK_MS)
    bus, worker_bus = RedisBus(redis_test_url()), RedisWorkerBus(redis_test_url())
    client = redis.Redis.from_url(redis_test_url(), decode_responses=True)
    a, b = uid("a"), uid("b")
    idle_a = asyncio.create_task(bus.read_events(a, 0, BLOCK_MS))
    await async_wait_until(
        lambda: bus._fanout._reading == {stream_key(a)}, message="the shared XREAD blocks on A"
    )
    events = _events(b, 5)
    worker_bus.publish(b, events[0])
    started = time.monotonic()
    assert await bus.read_events(b, 0, BLOCK_MS) == events[:1]
    assert time.monotonic() - started < 0.2 * fanout_module.SHARED_BLOCK_MS / 1000
    wake_key = bus._fanout._wake_key
    assert client.xinfo_stream(wake_key)["entries-added"] == 1
    for seq, event in enumerate(events[1:], start=1):
        threading.Timer(0.02, worker_bus.publish, (b, event)).start()
        assert await bus.read_events(b, seq, BLOCK_MS) == [event]
    assert client.xinfo_stream(wake_key)["entries-added"] == 1
    assert not idle_a.done()
    await bus.close()
    with pytest.raises(BusUnavailable):
        await idle_a
    assert not client.exists(wake_key)
    client.close()


@needs_redis
@pytest.mark.asyncio
async def test_reads_from_before_the_shared_buffer_get_every_event():
    """After a reader has moved the shared buffer past seq 7, a resume from any
    earlier seq still gets exactly the events after it, blocking or not."""
    bus, worker_bus = RedisBus(redis_test_url()), RedisWorkerBus(redis_test_url())
    rid = uid("resume")
    events = _events(rid, 8, terminal=False)  # seqs 1..9, still open
    worker_bus.publish_many([(rid, e) for e in events])
    assert await bus.read_events(rid, 0, BLOCK_MS) == events
    assert await bus.read_events(rid, 7, BLOCK_MS) == events[7:]
    assert bus._fanout._streams[stream_key(rid)].base == 7
    for k in reversed(range(9)):
        assert await bus.read_events(rid, k, BLOCK_MS) == events[k:]
        assert await bus.read_events(rid, k, 0) == events[k:]
    # Past the end: nothing, after the wait.
    started = time.monotonic()
    assert await bus.read_events(rid, 9, 300) == []
    assert time.monotonic() - started >= 0.25
    await bus.close()


@needs_redis
@pytest.mark.asyncio
async def test_streams_leave_the_shared_read_at_their_end_or_when_abandoned(monkeypatch):
    """A stream read to its terminal event leaves at once (and the reader task
    ends with the last one); a stream whose reader went away leaves after
    IDLE_S, with its buffer."""
    monkeypatch.setattr(fanout_module, "IDLE_S", 0.5)
    bus, worker_bus = RedisBus(redis_test_url()), RedisWorkerBus(redis_test_url())
    done, abandoned = uid("done"), uid("abandoned")
    streams = bus._fanout._streams
    worker_bus.publish_many([(abandoned, e) for e in _events(abandoned, 1, terminal=False)])
    assert len(await bus.read_events(abandoned, 0, BLOCK_MS)) == 2
    reader = asyncio.create_task(_collect(bus, done))
    events = _events(done, 3)
    worker_bus.publish_many([(done, e) for e in events])
    assert await asyncio.wait_for(reader, 30) == events
    assert stream_key(done) not in streams
    # The abandoned stream gets more events nobody reads, then is dropped.
    worker_bus.publish(abandoned, _events(abandoned, 2, terminal=False)[-1])
    await async_wait_until(lambda: stream_key(abandoned) not in streams, timeout=10)
    await async_wait_until(lambda: bus._fanout._task is None, timeout=10, message="reader exit")
    assert _fanout_tasks() == []
    await bus.close()


@pytest.mark.asyncio
async def test_redis_dying_raises_bus_unavailable_and_reads_recover(private_redis):
    """Redis killed under blocked reads: each raises BusUnavailable (the
    reader task does not die silently), so does a new read while it is down;
    once it is back the next reads work with no new bus."""
    bus, worker_bus = RedisBus(private_redis.url), RedisWorkerBus(private_redis.url)
    rids = [uid("dies") for _ in range(3)]
    blocked = [asyncio.create_task(bus.read_events(rid, 0, BLOCK_MS)) for rid in rids]
    await async_wait_until(lambda: bus._fanout._reading == {stream_key(r) for r in rids})
    private_redis.kill()
    started = time.monotonic()
    for task in blocked:
        with pytest.raises(BusUnavailable):
            await asyncio.wait_for(task, 30)
    assert time.monotonic() - started < 0.8 * BLOCK_MS / 1000
    assert bus._fanout._task is None and bus._fanout._streams == {}
    with pytest.raises(BusUnavailable):
        await bus.read_events(rids[0], 0, BLOCK_MS)

    private_redis.start()
    worker_bus = RedisWorkerBus(private_redis.url)
    events = _events(rids[0], 2)
    threading.Timer(0.2, worker_bus.publish_many, ([(rids[0], e) for e in events],)).start()
    assert await _collect(bus, rids[0]) == events
    await bus.close()


@pytest.mark.asyncio
async def test_unreachable_redis_raises_at_once_for_a_long_blocking_read():
    bus = RedisBus("redis://127.0.0.1:6390/0")  # nothing listens there
    started = time.monotonic()
    with pytest.raises(BusUnavailable):
        await bus.read_events("r", 0, BLOCK_MS)
    assert time.monotonic() - started < 0.8 * BLOCK_MS / 1000
    await bus.close()
    assert _fanout_tasks() == []


@needs_redis
@pytest.mark.asyncio
async def test_close_ends_blocked_reads_and_leaves_no_task(monkeypatch):
    """close() ends the reader task and every blocked read (BusUnavailable),
    at once, even right after a delivery, while the reader is writing its
    next XREAD (a cancel there is lost on Python 3.11: close must insist)."""
    monkeypatch.setattr(fanout_module, "SHARED_BLOCK_MS", BLOCK_MS)
    bus, worker_bus = RedisBus(redis_test_url()), RedisWorkerBus(redis_test_url())
    rids = [uid("close") for _ in range(5)]
    blocked = [asyncio.create_task(bus.read_events(rid, 0, BLOCK_MS)) for rid in rids[1:]]
    await async_wait_until(lambda: bus._fanout._reading == {stream_key(r) for r in rids[1:]})
    assert len(_fanout_tasks()) == 1
    event = _events(rids[0], 0, terminal=False)[0]
    threading.Timer(0.1, worker_bus.publish, (rids[0], event)).start()
    assert await bus.read_events(rids[0], 0, BLOCK_MS) == [event]
    started = time.monotonic()
    await bus.close()
    results = await asyncio.gather(*blocked, return_exceptions=True)
    assert all(isinstance(r, BusUnavailable) for r in results), results
    assert time.monotonic() - started < 1.0
    assert asyncio.all_tasks() == {asyncio.current_task()}
    with pytest.raises(BusUnavailable):
        await bus.read_events(rids[0], 0, BLOCK_MS)
