"""The versioned control snapshot: schema, publication to Redis, the reader.

The control plane (PostgreSQL, Celery) writes deployments, routing
thresholds, tiers and the model catalog; ``fleet.services.snapshot_publish``
turns them into one JSON document with a rising ``version`` and stores it
in Redis. Web processes and workers route from ``snapshot_current()``:
an in-process copy refreshed from Redis every ``FLEET_SNAPSHOT_REFRESH``
seconds. A document that fails validation, an older version, or Redis
being unreachable all keep the last valid copy, so a control-plane outage
stops rollouts but never serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

# Compare-and-set on the version, so a slow publisher cannot overwrite a
# newer snapshot with an older one.
_PUBLISH_IF_NEWER = """
local current = redis.call('HGET', KEYS[1], 'version')
if current and tonumber(current) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'document', ARGV[2])
return 1
"""


class SnapshotInvalid(ValueError):
    """The document does not follow the schema; it is refused."""


@dataclass(slots=True, frozen=True)
class RoutingThresholds:
    max_kv_usage: float = 0.85
    max_queue: int = 8
    successors: int = 3
    virtual_nodes: int = 64
    target_tokens_per_replica: int = 8192
    max_queue_age_seconds: float = 2.0
    warm_reserve: int = 0


@dataclass(slots=True, frozen=True)
class TierSettings:
    name: str
    display_name: str
    rpm: int
    tpm: int
    monthly_token_quota: int
    max_context_tokens: int
    max_output_tokens: int
    max_concurrent_requests: int
    scheduling_weight: float
    priority: int
    queue_sla_seconds: int
    api_access: bool


@dataclass(slots=True, frozen=True)
class CatalogModel:
    name: str
    path: str
    context_length: int
    tiers: tuple[str, ...]


@dataclass(slots=True, frozen=True)
class DeploymentSpec:
    model: str
    version: str
    weights_path: str
    replicas: int
    traffic_weight: int
    hourly_price: float
    warmup_seconds: int
    state: str


@dataclass(slots=True, frozen=True)
class RolloutSpec:
    id: int
    model: str
    stable_version: str
    canary_version: str
    canary_percent: int
    shadow_share: float
    state: str


@dataclass(slots=True, frozen=True)
class Snapshot:
    version: int
    published_at: float
    routing: RoutingThresholds
    tiers: dict[str, TierSettings] = field(default_factory=dict)
    models: dict[str, CatalogModel] = field(default_factory=dict)
    deployments: tuple[DeploymentSpec, ...] = ()
    rollouts: tuple[RolloutSpec, ...] = ()

    def deployments_of(self, model: str) -> list[DeploymentSpec]:
        return [d for d in self.deployments if d.model == model]

    def rollout_of(self, model: str) -> RolloutSpec | None:
        return next((r for r in self.rollouts if r.model == model), None)

    def to_document(self) -> dict[str, Any]:
        return asdict(self)


# -- validation ------------------------------------------------------------------

_TYPES = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}


def _record(cls, data: Any, where: str, types: dict[str, type]):
    if not isinstance(data, dict):
        raise SnapshotInvalid(f"{where}: expected an object")
    values = {}
    for name, kind in types.items():
        if name not in data:
            raise SnapshotInvalid(f"{where}: missing {name!r}")
        value = data[name]
        # bool is an int subclass: a flag must not pass as a count.
        if not isinstance(value, _TYPES[kind]) or (kind is not bool and isinstance(value, bool)):
            raise SnapshotInvalid(f"{where}.{name}: expected {kind.__name__}")
        values[name] = value
    return cls(**values)


def _fields(cls) -> dict[str, type]:
    kinds = {"int": int, "float": float, "str": str, "bool": bool}
    return {f.name: kinds[f.type] for f in cls.__dataclass_fields__.values() if f.type in kinds}


def snapshot_parse(document: Any) -> Snapshot:
    """Validate a published document; raises SnapshotInvalid naming the fault."""
    if not isinstance(document, dict):
        raise SnapshotInvalid("snapshot: expected an object")
    head = _record(dict, document, "snapshot", {"version": int, "published_at": float})
    if head["version"] < 1:
        raise SnapshotInvalid("snapshot.version: must be positive")
    routing = _record(
        RoutingThresholds, document.get("routing"), "routing", _fields(RoutingThresholds)
    )
    if not 0 < routing.max_kv_usage <= 1 or routing.successors < 1 or routing.virtual_nodes < 1:
        raise SnapshotInvalid("routing: thresholds out of range")
    tiers = {}
    for name, data in _mapping(document, "tiers").items():
        tiers[name] = _record(TierSettings, data, f"tiers.{name}", _fields(TierSettings))
    models = {}
    for name, data in _mapping(document, "models").items():
        tier_names = data.get("tiers") if isinstance(data, dict) else None
        if not isinstance(tier_names, list) or not all(isinstance(t, str) for t in tier_names):
            raise SnapshotInvalid(f"models.{name}.tiers: expected a list of tier names")
        fields = {"name": str, "path": str, "context_length": int}
        base = _record(dict, data, f"models.{name}", fields)
        models[name] = CatalogModel(tiers=tuple(tier_names), **base)
    deployments = tuple(
        _record(DeploymentSpec, d, f"deployments[{i}]", _fields(DeploymentSpec))
        for i, d in enumerate(_sequence(document, "deployments"))
    )
    rollouts = tuple(
        _record(RolloutSpec, r, f"rollouts[{i}]", _fields(RolloutSpec))
        for i, r in enumerate(_sequence(document, "rollouts"))
    )
    _check_weights(deployments)
    return Snapshot(
        version=head["version"],
        published_at=float(head["published_at"]),
        routing=routing,
        tiers=tiers,
        models=models,
        deployments=deployments,
        rollouts=rollouts,
    )


def _mapping(document: dict, key: str) -> dict:
    value = document.get(key)
    if not isinstance(value, dict):
        raise SnapshotInvalid(f"{key}: expected an object")
    return value


def _sequence(document: dict, key: str) -> list:
    value = document.get(key)
    if not isinstance(value, list):
        raise SnapshotInvalid(f"{key}: expected a list")
    return value


def _check_weights(deployments: tuple[DeploymentSpec, ...]) -> None:
    totals: dict[str, int] = {}
    seen = set()
    for d in deployments:
        if (d.model, d.version) in seen:
            raise SnapshotInvalid(f"deployments: {d.model}@{d.version} appears twice")
        seen.add((d.model, d.version))
        if not 0 <= d.traffic_weight <= 100:
            raise SnapshotInvalid(f"deployments: {d.model}@{d.version} weight out of 0..100")
        totals[d.model] = totals.get(d.model, 0) + d.traffic_weight
    for model, total in totals.items():
        if total != 100:
            raise SnapshotInvalid(f"deployments: weights of {model} add up to {total}, not 100")


# -- storage ---------------------------------------------------------------------

_memory_store: dict[str, Any] = {}
_clients: dict[str, redis.Redis] = {}


def _key() -> str:
    return settings.FLEET_SNAPSHOT_KEY


def _client() -> redis.Redis | None:
    url = settings.REDIS_URL
    if not url:
        return None
    client = _clients.get(url)
    if client is None:
        # Short timeouts: a refresh must never hold a request for long.
        client = _clients[url] = redis.Redis.from_url(
            url, socket_timeout=0.5, socket_connect_timeout=0.5
        )
    return client


def snapshot_store(document: dict[str, Any]) -> bool:
    """Store a validated document unless a newer version is already there."""
    snapshot_parse(document)
    payload = json.dumps(document, separators=(",", ":"))
    client = _client()
    if client is None:
        current = _memory_store.get(_key())
        if current is not None and current[0] >= document["version"]:
            return False
        _memory_store[_key()] = (document["version"], payload)
        return True
    return bool(client.eval(_PUBLISH_IF_NEWER, 1, _key(), document["version"], payload))


def snapshot_next_version() -> int:
    client = _client()
    if client is None:
        current = _memory_store.get(_key())
        return (current[0] if current else 0) + 1
    return int(client.incr(_key() + ":seq"))


def snapshot_store_raw(payload: str, version: int) -> None:
    """Write a document as is, bypassing validation (operators' tools, tests)."""
    client = _client()
    if client is None:
        _memory_store[_key()] = (version, payload)
    else:
        client.hset(_key(), mapping={"version": version, "document": payload})


def _fetch() -> str | None:
    client = _client()
    if client is None:
        found = _memory_store.get(_key())
        return found[1] if found else None
    raw = client.hget(_key(), "document")
    return raw.decode() if raw is not None else None


# -- the reader ------------------------------------------------------------------


@dataclass(slots=True)
class _ReaderState:
    snapshot: Snapshot | None = None
    checked_at: float = float("-inf")
    rejected: int = 0
    last_error: str = ""


_state = _ReaderState()
_lock = threading.Lock()


def snapshot_current(*, max_age: float | None = None) -> Snapshot | None:
    """The last valid snapshot, refreshed from the store when older than ``max_age``.

    None only when no valid snapshot was ever seen by this process.
    """
    refresh = settings.FLEET_SNAPSHOT_REFRESH if max_age is None else max_age
    now = time.monotonic()
    if now - _state.checked_at < refresh:
        return _state.snapshot
    with _lock:
        if time.monotonic() - _state.checked_at >= refresh:
            _refresh()
        return _state.snapshot


def _refresh() -> None:
    _state.checked_at = time.monotonic()
    try:
        payload = _fetch()
    except redis.RedisError as exc:
        _state.last_error = f"store unreachable: {exc}"
        return
    if payload is None:
        return
    try:
        candidate = snapshot_parse(json.loads(payload))
    except (SnapshotInvalid, ValueError) as exc:
        _state.rejected += 1
        _state.last_error = f"rejected: {exc}"
        logger.error("fleet snapshot refused, keeping version %s: %s", _version(), exc)
        return
    if _state.snapshot is None or candidate.version >= _state.snapshot.version:
        _state.snapshot = candidate
        _state.last_error = ""


def _version() -> int | None:
    return _state.snapshot.version if _state.snapshot else None


def snapshot_reader_status() -> dict[str, Any]:
    return {"version": _version(), "rejected": _state.rejected, "last_error": _state.last_error}


def snapshot_reset() -> None:
    """Forget the in-process copy (tests that switch stores)."""
    with _lock:
        _state.snapshot = None
        _state.checked_at = float("-inf")
        _state.rejected = 0
        _state.last_error = ""


async def asnapshot_current() -> Snapshot | None:
    """``snapshot_current`` for async callers: the store is read off the loop."""
    if time.monotonic() - _state.checked_at < settings.FLEET_SNAPSHOT_REFRESH:
        return _state.snapshot
    return await asyncio.to_thread(snapshot_current)
