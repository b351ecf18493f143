"""Pick the replica for one request: compatible, ready, then where its KV lives.

1. Compatibility: only READY workers (warmed up, not draining) of the
   requested model. When the snapshot has deployments for the model, only
   versions with a traffic weight count; the version is chosen from the
   routing key's hash against the weights, so a conversation stays on one
   version (and its cache) across turns while the shares hold.
2. Locality: a consistent-hash ring over that version's replicas maps the
   routing key (system prompt, conversation) to its owner, which likely
   holds the conversation's KV blocks.
3. Load: the owner is honoured only while its KV usage and queue are under
   the snapshot's thresholds; otherwise the next few ring successors take
   it: the one that served the key's previous fallback turn if it has room
   (it holds that turn's KV), else the least loaded.

Plain Python; ``inference.relay.dispatch`` supplies the registry and load view.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from fleet.ring import HashRing, ring_hash
from wire.snapshot import RoutingThresholds, Snapshot
from wire.workers import WorkerInfo, WorkerState

# (kv nearly full, queued requests, queued tokens): smaller is less loaded.
LoadKey = Callable[[WorkerInfo], tuple[bool, float, float]]


class Policy(StrEnum):
    CACHE_AWARE = "cache_aware"  # ring affinity with the load-aware fallback
    AFFINITY_ONLY = "affinity_only"  # ring owner always (no fallback)
    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"


@dataclass(slots=True, frozen=True)
class RouteDecision:
    worker: WorkerInfo
    version: str
    # The ring owner of the key, and whether it got the request.
    owner: str | None
    affinity: bool


_rings: OrderedDict[tuple[frozenset[str], int], HashRing] = OrderedDict()
# routing key -> the successor that took its last fallback turn (bounded LRU).
_second_home: OrderedDict[str, str] = OrderedDict()
SECOND_HOMES = 100_000
_round_robin = itertools.count()


def ring_for(worker_ids: frozenset[str], vnodes: int) -> HashRing:
    """Rings are rebuilt only when membership changes (a few per process)."""
    key = (worker_ids, vnodes)
    ring = _rings.get(key)
    if ring is None:
        ring = _rings[key] = HashRing(worker_ids, vnodes=vnodes)
        while len(_rings) > 32:
            _rings.popitem(last=False)
    else:
        _rings.move_to_end(key)
    return ring


def servable(workers: Sequence[WorkerInfo], model: str) -> list[WorkerInfo]:
    """Ready replicas of ``model``: never warming, draining or another model."""
    return [w for w in workers if w.model == model and w.state == WorkerState.READY]


def version_pools(
    workers: Sequence[WorkerInfo], model: str, snapshot: Snapshot | None
) -> list[tuple[str, int, list[WorkerInfo]]]:
    """(version, weight, ready replicas) for each version that may take traffic.

    Without deployments in the snapshot every ready replica is one pool.
    Versions with weight 0 (a warm standby, a retired one) are left out
    unless no weighted version has a ready replica: serving from the warm
    standby then beats refusing the request.
    """
    ready = servable(workers, model)
    deployments = snapshot.deployments_of(model) if snapshot else []
    if not deployments:
        return [("", 100, ready)] if ready else []
    by_version: dict[str, list[WorkerInfo]] = {}
    for worker in ready:
        by_version.setdefault(worker.version, []).append(worker)
    weighted = [
        (d.version, d.traffic_weight, by_version[d.version])
        for d in sorted(deployments, key=lambda d: d.version)
        if d.traffic_weight > 0 and by_version.get(d.version)
    ]
    if weighted:
        return weighted
    standby = [
        (d.version, 1, by_version[d.version])
        for d in deployments
        if d.state != "retired" and by_version.get(d.version)
    ]
    return standby[:1]


def choose_version(pools: list[tuple[str, int, list[WorkerInfo]]], routing_key: str) -> int:
    """Index of the pool for the key: a stable point in [0, total weight)."""
    total = sum(weight for _, weight, _ in pools)
    point = ring_hash(f"version:{routing_key}") % total
    for index, (_, weight, _) in enumerate(pools):
        if point < weight:
            return index
        point -= weight
    return len(pools) - 1


def route(
    workers: Sequence[WorkerInfo],
    *,
    model: str,
    routing_key: str,
    snapshot: Snapshot | None,
    load: LoadKey,
    queue_depth: Callable[[WorkerInfo], float],
    policy: Policy = Policy.CACHE_AWARE,
) -> RouteDecision | None:
    """The replica for one request, or None when no compatible one is ready."""
    pools = version_pools(workers, model, snapshot)
    if not pools:
        return None
    version, _, replicas = pools[choose_version(pools, routing_key)]
    if policy == Policy.ROUND_ROBIN:
        ordered = sorted(replicas, key=lambda w: w.worker_id)
        return RouteDecision(ordered[next(_round_robin) % len(ordered)], version, None, False)
    if policy == Policy.LEAST_LOADED:
        return RouteDecision(min(replicas, key=load), version, None, False)
    limits = snapshot.routing if snapshot else RoutingThresholds()
    by_id = {w.worker_id: w for w in replicas}
    ring = ring_for(frozenset(by_id), limits.virtual_nodes)
    ring_order = ring.successors(routing_key, max(limits.successors, 1) + 1)
    owner = by_id[ring_order[0]]
    if policy == Policy.AFFINITY_ONLY or _has_room(owner, limits, queue_depth):
        return RouteDecision(owner, version, owner.worker_id, True)
    # The next successors, not the owner: it just said it has no room.
    successors = ring_order[1:] or ring_order
    home = _second_home.get(routing_key)
    if home in successors and _has_room(by_id[home], limits, queue_depth):
        best = home
    else:
        # Ring order breaks ties, so equally loaded successors still spread keys.
        best = min(
            successors,
            key=lambda wid: (load(by_id[wid]), by_id[wid].kv_usage, successors.index(wid)),
        )
    _second_home[routing_key] = best
    _second_home.move_to_end(routing_key)
    while len(_second_home) > SECOND_HOMES:
        _second_home.popitem(last=False)
    return RouteDecision(by_id[best], version, owner.worker_id, best == owner.worker_id)


def _has_room(
    worker: WorkerInfo, limits: RoutingThresholds, queue_depth: Callable[[WorkerInfo], float]
) -> bool:
    return worker.kv_usage < limits.max_kv_usage and queue_depth(worker) < limits.max_queue
