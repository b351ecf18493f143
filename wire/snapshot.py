"""The control snapshot: its schema, validation, stores and reader.

The control plane (PostgreSQL, Celery) writes deployments, routing
thresholds, tiers and the model catalog and publishes them as one JSON
document with a rising ``version`` (``fleet.services.snapshot_publish``).
Web processes and workers read it through a ``SnapshotReader``: an
in-process copy refreshed from the store every few seconds. A document
that fails validation, an older version, or the store being unreachable
all keep the last valid copy, so a control-plane outage stops rollouts but
never serving.

Nothing here knows Django: the web tier builds its reader from settings
(``fleet.snapshot``), a worker from its command line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import redis

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
    # OpenAI's service_tier within the tier (tenants.Tier); defaulted, so a
    # snapshot published before these fields still parses.
    priority_service_tier: bool = False
    auto_service_tier: str = "default"


# Tier fields a snapshot published before them lacks (their defaults apply).
TIER_ADDED_FIELDS = frozenset({"priority_service_tier", "auto_service_tier"})


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

    def tier_weights(self) -> dict[str, float] | None:
        """Each tier's positive scheduling weight; None when no tier has one."""
        weights = {
            name: float(tier.scheduling_weight)
            for name, tier in self.tiers.items()
            if tier.scheduling_weight > 0
        }
        return weights or None

    def to_document(self) -> dict[str, Any]:
        return asdict(self)


# -- validation ------------------------------------------------------------------

_TYPES = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}


def _record(cls, data: Any, where: str, types: dict[str, type], optional=frozenset()):
    if not isinstance(data, dict):
        raise SnapshotInvalid(f"{where}: expected an object")
    values = {}
    for name, kind in types.items():
        if name not in data and name in optional:
            continue
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
        tiers[name] = _record(
            TierSettings, data, f"tiers.{name}", _fields(TierSettings), TIER_ADDED_FIELDS
        )
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


# -- stores ----------------------------------------------------------------------


class SnapshotStore(Protocol):
    """Where published documents live (Redis, or this process's memory)."""

    def fetch(self) -> str | None:
        """The stored document's JSON text, or None when none was published."""
        ...

    def store_if_newer(self, version: int, payload: str) -> bool:
        """Store unless a version >= ``version`` is there; True when stored."""
        ...

    def store_raw(self, version: int, payload: str) -> None:
        """Store as is, whatever is there (operators' tools, tests)."""
        ...

    def next_version(self) -> int:
        """A version number higher than any handed out before."""
        ...


class MemorySnapshotStore:
    """The embedded mode's store: one document per key, per process."""

    _documents: dict[str, tuple[int, str]] = {}
    _versions: dict[str, int] = {}
    _lock = threading.Lock()

    def __init__(self, key: str):
        self.key = key

    def fetch(self) -> str | None:
        found = self._documents.get(self.key)
        return found[1] if found else None

    def store_if_newer(self, version: int, payload: str) -> bool:
        with self._lock:
            current = self._documents.get(self.key)
            if current is not None and current[0] >= version:
                return False
            self._documents[self.key] = (version, payload)
            return True

    def store_raw(self, version: int, payload: str) -> None:
        with self._lock:
            self._documents[self.key] = (version, payload)

    def next_version(self) -> int:
        with self._lock:
            current = self._documents.get(self.key)
            issued = max(self._versions.get(self.key, 0), current[0] if current else 0) + 1
            self._versions[self.key] = issued
            return issued


class RedisSnapshotStore:
    """The document in a Redis hash (``version``, ``document``) at ``key``."""

    _clients: dict[str, redis.Redis] = {}

    def __init__(self, url: str, key: str):
        self.key = key
        client = self._clients.get(url)
        if client is None:
            # Short timeouts: a refresh must never hold a request for long.
            client = self._clients[url] = redis.Redis.from_url(
                url, socket_timeout=0.5, socket_connect_timeout=0.5
            )
        self._client = client

    def fetch(self) -> str | None:
        raw = self._client.hget(self.key, "document")
        return raw.decode() if raw is not None else None

    def store_if_newer(self, version: int, payload: str) -> bool:
        return bool(self._client.eval(_PUBLISH_IF_NEWER, 1, self.key, version, payload))

    def store_raw(self, version: int, payload: str) -> None:
        self._client.hset(self.key, mapping={"version": version, "document": payload})

    def next_version(self) -> int:
        return int(self._client.incr(self.key + ":seq"))


def snapshot_store_for(redis_url: str | None, key: str) -> SnapshotStore:
    """Redis at ``redis_url``, or this process's memory without one."""
    return RedisSnapshotStore(redis_url, key) if redis_url else MemorySnapshotStore(key)


def snapshot_write(store: SnapshotStore, document: dict[str, Any]) -> bool:
    """Validate and store ``document`` unless a newer version is there."""
    snapshot_parse(document)
    payload = json.dumps(document, separators=(",", ":"))
    return store.store_if_newer(document["version"], payload)


# -- the reader ------------------------------------------------------------------


class SnapshotReader:
    """The last valid snapshot, refreshed from a store at most every ``refresh`` s.

    Args:
        store: returns the store to read (called on each refresh, so a
            process whose settings change follows them).
        refresh: returns the refresh interval in seconds.
    """

    def __init__(self, store: Callable[[], SnapshotStore], refresh: Callable[[], float]):
        self._store = store
        self._refresh_interval = refresh
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget the in-process copy (tests that switch stores)."""
        self.snapshot: Snapshot | None = None
        self.checked_at = float("-inf")
        self.rejected = 0
        self.last_error = ""

    def current(self, *, max_age: float | None = None) -> Snapshot | None:
        """The last valid snapshot, refreshed when older than ``max_age``.

        None only when no valid snapshot was ever seen by this reader.
        """
        refresh = self._refresh_interval() if max_age is None else max_age
        if time.monotonic() - self.checked_at < refresh:
            return self.snapshot
        with self._lock:
            if time.monotonic() - self.checked_at >= refresh:
                self._refresh()
            return self.snapshot

    async def acurrent(self) -> Snapshot | None:
        """``current`` for async callers: the store is read off the loop."""
        if time.monotonic() - self.checked_at < self._refresh_interval():
            return self.snapshot
        return await asyncio.to_thread(self.current)

    def status(self) -> dict[str, Any]:
        return {"version": self.version, "rejected": self.rejected, "last_error": self.last_error}

    @property
    def version(self) -> int | None:
        return self.snapshot.version if self.snapshot else None

    def _refresh(self) -> None:
        self.checked_at = time.monotonic()
        try:
            payload = self._store().fetch()
        except redis.RedisError as exc:
            self.last_error = f"store unreachable: {exc}"
            return
        if payload is None:
            return
        try:
            candidate = snapshot_parse(json.loads(payload))
        except (SnapshotInvalid, ValueError) as exc:
            self.rejected += 1
            self.last_error = f"rejected: {exc}"
            logger.error("fleet snapshot refused, keeping version %s: %s", self.version, exc)
            return
        if self.snapshot is None or candidate.version >= self.snapshot.version:
            self.snapshot = candidate
            self.last_error = ""
