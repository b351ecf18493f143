"""The bus on Redis: streams for requests and events, keys for heartbeats.

Keys:
  llm:w:{worker_id}:req    stream of GenerationRequest JSON (field ``r``),
                           read through the consumer group ``workers``
  llm:w:{worker_id}:abort  stream of response ids to abort (field ``id``)
  llm:inboxes:{model}      set of the worker ids whose inboxes hold the
                           model's requests (peers look there for orphans)
  llm:r:{response_id}      stream of events (field ``e``), entry id 0-{seq}
  llm:r:{response_id}:term the terminal event's seq, once there is one
  llm:wake:{token}         a web bus's private stream: an entry wakes its
                           shared XREAD when a response stream joins it
  llm:workers              hash worker_id -> WorkerInfo JSON
  llm:hb:{worker_id}       exists while the worker's heartbeat is fresh;
                           "2" from workers that keep a liveness key
  llm:hb:{worker_id}:live  exists while the worker's process is alive
                           (``LIVENESS_TTL``, refreshed off the engine thread)
  llm:hb:{worker_id}:closed exists while the worker drains: peers may take
                           what is still queued in its inbox

Entry ids ``0-{seq}`` make resume exact: XREAD from ``0-{after_seq}``
returns precisely the events after it. Every append goes through a Lua
script that first checks the ``:term`` key, so a stream never gets a second
terminal event, whoever (worker or web tier) writes it.

Modules: ``common`` (keys, scripts), ``web`` (``RedisBus``, the async web
side), ``fanout`` (the web side's one shared XREAD over all the response
streams it reads), ``worker`` (``RedisWorkerBus``) and ``intake`` (the
worker's consumer-group reads, acks and reclaims).

Access (docker/redis/users.acl.template): the web's Redis user writes
``llm:w:*`` without reading it and reads ``llm:r:*`` (and its own
``llm:wake:*``); a worker's user reads and acknowledges ``llm:w:*`` and
writes ``llm:r:*`` without reading it, the registry and heartbeats
write-only. Credentials come in the URL
(``BusConfig``).
"""

from wire.bus.redis_bus.common import (
    OPEN_STREAM_TTL,
    WORKERS_KEY,
    abort_key,
    heartbeat_key,
    live_key,
    request_key,
    stream_key,
    terminal_key,
)
from wire.bus.redis_bus.web import RedisBus
from wire.bus.redis_bus.worker import RedisWorkerBus

__all__ = [
    "OPEN_STREAM_TTL",
    "WORKERS_KEY",
    "RedisBus",
    "RedisWorkerBus",
    "abort_key",
    "heartbeat_key",
    "live_key",
    "request_key",
    "stream_key",
    "terminal_key",
]
