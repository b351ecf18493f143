"""Keys, scripts and error mapping shared by both sides of the Redis bus."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import redis

from wire.bus.base import BusUnavailable
from wire.codec import decode_event
from wire.events import Event

WORKERS_KEY = "llm:workers"
# Open streams (worker still writing) expire this long after the last event,
# so the stream of a worker that died unobserved does not stay forever.
OPEN_STREAM_TTL = 3600
# Request and abort streams of a worker that vanished with work queued.
INBOX_TTL = 86400
# Longest single XREAD wait; the socket timeout must stay above it.
MAX_BLOCK_MS = 5000
SOCKET_TIMEOUT = 10.0
# Web tier: blocking reads of open responses share one connection
# (fanout.py), but resumes read directly and every other call takes a
# pooled connection too; redis-py's asyncio pool refuses its 101st
# connection by default, which once failed requests with bus_unavailable.
# A larger pool that waits (up to POOL_WAIT) when full.
MAX_CONNECTIONS = 1024
POOL_WAIT = 10.0

# The worker's append. ARGV: stream, term, seq, event JSON, is_terminal,
# response ttl, open ttl. The keys are arguments, not KEYS: Redis checks a
# script's declared keys for read and write access (it cannot tell how they
# are used), and a worker's ACL user may only write response streams. Each
# command inside is still checked against the user's key patterns; EXISTS
# needs no read access.
PUBLISH_LUA = """
if redis.call('EXISTS', ARGV[2]) == 1 then return 0 end
local added = redis.pcall('XADD', ARGV[1], '0-' .. ARGV[3], 'e', ARGV[4])
if type(added) == 'table' and added.err then return 0 end
if ARGV[5] == '1' then
  redis.call('SET', ARGV[2], ARGV[3], 'EX', ARGV[6])
  redis.call('EXPIRE', ARGV[1], ARGV[6])
else
  redis.call('EXPIRE', ARGV[1], ARGV[7])
end
return 1
"""

# KEYS: stream, term. ARGV: event JSON without its opening brace, ttl.
# The seq is one past the last entry, chosen inside the script so that it
# cannot collide with a worker append racing this call.
PUBLISH_IF_OPEN_LUA = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local seq = 1
if #last > 0 then seq = tonumber(string.match(last[1][1], '-(%d+)$')) + 1 end
redis.call('XADD', KEYS[1], '0-' .. seq, 'e', '{"seq":' .. seq .. ',' .. ARGV[1])
redis.call('SET', KEYS[2], seq, 'EX', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return seq
"""


def request_key(worker_id: str) -> str:
    return f"llm:w:{worker_id}:req"


def abort_key(worker_id: str) -> str:
    return f"llm:w:{worker_id}:abort"


def stream_key(response_id: str) -> str:
    return f"llm:r:{response_id}"


def terminal_key(response_id: str) -> str:
    return f"llm:r:{response_id}:term"


def wake_key(token: str) -> str:
    """A web bus's private stream, written to wake its shared XREAD (fanout.py)."""
    return f"llm:wake:{token}"


def heartbeat_key(worker_id: str) -> str:
    return f"llm:hb:{worker_id}"


def live_key(worker_id: str) -> str:
    return f"llm:hb:{worker_id}:live"


def closed_key(worker_id: str) -> str:
    return f"llm:hb:{worker_id}:closed"


def inboxes_key(model: str) -> str:
    return f"llm:inboxes:{model}"


# The heartbeat key's value from workers that keep a liveness key; an older
# worker writes "1" and is judged by its heartbeat alone (rolling deploys).
LIVENESS_MARK = "2"
# The consumer group every request stream is read through.
GROUP = "workers"


def alive(heartbeat: str | None, live: str | None) -> bool:
    """Whether a worker is alive, from its heartbeat and liveness values.

    Either lapsing is death: the liveness key within seconds of a kill, the
    heartbeat when the heartbeat thread itself is stuck.
    """
    return heartbeat is not None and (heartbeat != LIVENESS_MARK or live is not None)


@contextlib.contextmanager
def unavailable_as_bus_error() -> Iterator[None]:
    """Turn Redis connection trouble into BusUnavailable (the API's 503)."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise BusUnavailable(f"Redis is unavailable: {exc}") from exc


def decode_entries(entries: Any) -> list[Event]:
    """The events of one stream's XREAD entries: ``[(id, {"e": json}), ...]``."""
    return [decode_event(fields["e"]) for _, fields in entries]


def _decode_events(reply: Any) -> list[Event]:
    if not reply:
        return []
    # XREAD reply: [[key, [(id, {field: value}), ...]]]
    return decode_entries(reply[0][1])
