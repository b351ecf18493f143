"""One shared XREAD for every response stream an event loop is reading.

Why: each open response used to block a pooled connection in its own XREAD
and issue a new one per token, so Daphne spent about a third of its CPU in
Redis round trips and pool bookkeeping, on cores it shares with the engine.
Here one background task per ``RedisBus`` (so per event loop) blocks in a
single XREAD over every stream that has a reader, on a connection of its
own, and hands what arrives to the waiting ``read_events`` calls: one round
trip per batch of events across all streams instead of one per event.

- Joining: a stream enters the next XREAD. If the reader is already blocked
  in one without it, an entry on the bus's private wake stream (part of
  every shared XREAD) ends that XREAD at once: one wake per change of the
  set, never per token.
- Staying: a reader comes back within milliseconds of its last events, so a
  stream stays in the read between its calls (no wake while it streams).
  It leaves after its terminal event, or once nobody asked for it for
  ``IDLE_S`` (the client left): buffers stay bounded.
- Buffering: per stream, the events in (``base``, ``cursor``], ``cursor``
  being the last entry the shared XREAD saw. A call trims what is at or
  before its ``after_seq``; a call asking for events before ``base`` (a
  resume, or a second, slower reader) reads Redis directly, as before.
- Failure: the reader task hands its error to every waiter (the bus raises
  ``BusUnavailable`` for connection trouble), forgets all streams and ends;
  the next call starts a new one, so reads work again once Redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import redis.asyncio as aioredis

from wire.bus.base import BusUnavailable
from wire.bus.redis_bus.common import decode_entries
from wire.events import Event, Terminal

log = logging.getLogger(__name__)

# One shared XREAD's wait. Short, because the reader only looks for idle
# streams between XREADs; joins do not wait for it (they wake the reader).
SHARED_BLOCK_MS = 1000
# A stream nobody asked for this long leaves the shared read, buffer and all.
IDLE_S = 10.0
# The wake stream of a process that died without close() goes away by itself.
WAKE_TTL = 3600


class _Stream:
    """One response stream in the shared read."""

    __slots__ = ("base", "cursor", "events", "ended", "error", "changed", "waiters", "asked_at")

    def __init__(self, after_seq: int, now: float):
        self.base = after_seq  # the buffer holds every event in (base, cursor]
        self.cursor = after_seq  # the shared XREAD reads after 0-{cursor}
        self.events: list[Event] = []
        self.ended = False  # terminal event seen: no longer read
        self.error: Exception | None = None
        self.changed = asyncio.Event()
        self.waiters = 0
        self.asked_at = now

    def notify(self) -> None:
        # A fresh Event per change: waiters of the old one all wake, and a
        # set event never needs clearing (which could drop a wake-up).
        self.changed.set()
        self.changed = asyncio.Event()

    def take(self, after_seq: int) -> list[Event]:
        """The buffered events after ``after_seq`` (which is >= base)."""
        if after_seq > self.base:
            self.events = [e for e in self.events if e.seq > after_seq]
            self.base = min(after_seq, self.cursor)
        return list(self.events)


class StreamFanout:
    """The shared reader of one ``RedisBus``; see the module docstring."""

    def __init__(self, redis: aioredis.Redis, wake_key: str):
        self._redis = redis  # the bus's pooled client: wakes, direct reads
        self._conn = redis.client()  # one connection of its own for the shared XREAD
        self._wake_key = wake_key
        self._wake_id = "0-0"
        self._woke = False  # a wake is on its way to the XREAD in flight
        self._wake_used = False  # the wake stream exists: close() deletes it
        self._streams: dict[str, _Stream] = {}
        self._reading: frozenset[str] | None = None  # keys of the XREAD in flight
        self._task: asyncio.Task[None] | None = None
        self._connect_lock = asyncio.Lock()
        self._swept_at = 0.0
        self._closed = False

    async def read(self, key: str, after_seq: int, block_s: float) -> list[Event]:
        """Events of stream ``key`` after ``after_seq``, waiting up to ``block_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + block_s
        stream = self._streams.get(key) or await self._join(key, after_seq)
        while True:
            if stream.error is not None:
                # The bus maps Redis trouble to BusUnavailable, as for any call.
                raise _copy(stream.error) from stream.error
            if after_seq < stream.base:
                # Older than the buffer: a resume, or a slower second reader.
                return await self._direct(key, after_seq, deadline - loop.time())
            stream.asked_at = loop.time()
            events = stream.take(after_seq)
            if events:
                if (
                    isinstance(events[-1], Terminal)
                    and not stream.waiters
                    and self._streams.get(key) is stream
                ):
                    del self._streams[key]  # done; nobody else is waiting on it
                return events
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            stream.waiters += 1
            try:
                async with asyncio.timeout(remaining):
                    await stream.changed.wait()
            except TimeoutError:
                return []
            finally:
                stream.waiters -= 1
                stream.asked_at = loop.time()

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        while task is not None and not task.done():
            # Again until it takes: on Python 3.11 a cancel that lands while
            # redis-py writes the command is swallowed (its asyncio.wait_for),
            # and the XREAD would run its course.
            task.cancel()
            await asyncio.wait({task}, timeout=0.05)
        self._fail(BusUnavailable("The bus was closed"))
        with contextlib.suppress(Exception):
            if self._wake_used:
                await self._redis.delete(self._wake_key)
        with contextlib.suppress(Exception):
            await self._conn.aclose()

    async def _join(self, key: str, after_seq: int) -> _Stream:
        if self._closed:
            raise BusUnavailable("The bus was closed")
        if self._task is None:
            # Starting a reader: connect in this call, so that an unreachable
            # Redis raises here (as a direct XREAD would), not after block_ms.
            async with self._connect_lock:
                if self._task is None:
                    await self._conn.initialize()
                    await self._conn.connection.connect()  # no-op when connected
        if key in self._streams:  # joined by another call meanwhile
            return self._streams[key]
        loop = asyncio.get_running_loop()
        self._sweep(loop.time())
        stream = self._streams[key] = _Stream(after_seq, loop.time())
        if self._task is None:
            # Its first XREAD includes the stream.
            self._task = asyncio.create_task(self._run(), name=f"bus fan-out {self._wake_key}")
        elif self._reading is not None and key not in self._reading and not self._woke:
            self._woke = self._wake_used = True
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xadd(self._wake_key, {"w": "1"}, maxlen=1)
                pipe.expire(self._wake_key, WAKE_TTL)
                await pipe.execute()
        return stream

    async def _direct(self, key: str, after_seq: int, block_s: float) -> list[Event]:
        block = int(block_s * 1000) if block_s >= 0.001 else None
        reply = await self._redis.xread({key: f"0-{after_seq}"}, block=block)
        return [event for _, entries in reply or () for event in decode_entries(entries)]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._closed:
                self._sweep(loop.time())
                cursors = {k: f"0-{s.cursor}" for k, s in self._streams.items() if not s.ended}
                if not cursors:
                    break  # the next join starts a new task
                self._reading, self._woke = frozenset(cursors), False
                try:
                    reply = await self._conn.xread(
                        {**cursors, self._wake_key: self._wake_id}, block=SHARED_BLOCK_MS
                    )
                finally:
                    self._reading = None
                self._deliver(cursors, reply)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Not silent: logged, and raised in every waiting read_events.
            log.warning("Shared bus reader failed: %r", exc)
            self._fail(exc)
        finally:
            if self._task is asyncio.current_task():
                self._task = None

    def _deliver(self, cursors: dict[str, str], reply: Any) -> None:
        for key, entries in reply or ():
            if key == self._wake_key:
                self._wake_id = entries[-1][0]
                continue
            stream = self._streams.get(key)
            # Read from another cursor: the stream left and joined again meanwhile.
            if stream is None or stream.ended or cursors.get(key) != f"0-{stream.cursor}":
                continue
            for (entry_id, _), event in zip(entries, decode_entries(entries), strict=True):
                stream.events.append(event)
                stream.cursor = int(entry_id.rpartition("-")[2])
                if isinstance(event, Terminal):
                    stream.ended = True
                    break
            stream.notify()

    def _sweep(self, now: float) -> None:
        """Forget streams nobody has asked for in IDLE_S (at most once a second)."""
        if now - self._swept_at < 1.0:
            return
        self._swept_at = now
        for key, stream in list(self._streams.items()):
            if not stream.waiters and now - stream.asked_at > IDLE_S:
                del self._streams[key]

    def _fail(self, exc: Exception) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.error = exc
            stream.notify()


def _copy(exc: Exception) -> Exception:
    """A fresh exception per waiter: one instance raised in many tasks
    would collect all their tracebacks."""
    try:
        return type(exc)(*exc.args)
    except Exception:
        return RuntimeError(str(exc))
