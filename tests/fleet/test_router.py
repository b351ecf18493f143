"""The router's filters and choices, on heartbeat records (no bus, no model)."""

from __future__ import annotations

import time

from fleet.router import Policy, route, version_pools
from wire.snapshot import DeploymentSpec, RoutingThresholds, Snapshot
from wire.workers import WorkerInfo, WorkerState

MODEL = "m"


def worker(wid, *, model=MODEL, state=WorkerState.READY, version="", running=0, kv=0):
    return WorkerInfo(
        worker_id=wid,
        model=model,
        state=state,
        version=version,
        running=running,
        kv_blocks_used=kv,
        kv_blocks_total=100,
    )


def snapshot(*deployments: tuple[str, int], **routing) -> Snapshot:
    return Snapshot(
        version=1,
        published_at=time.time(),
        routing=RoutingThresholds(**routing),
        deployments=tuple(
            DeploymentSpec(MODEL, v, "", 1, w, 0.0, 60, "active" if w else "warm_standby")
            for v, w in deployments
        ),
    )


def load(w: WorkerInfo):
    return (w.kv_usage >= 0.95, w.running + w.waiting, w.queued_tokens)


def pick(workers, key, snap=None, policy=Policy.CACHE_AWARE):
    return route(
        workers,
        model=MODEL,
        routing_key=key,
        snapshot=snap,
        load=load,
        queue_depth=lambda w: w.running + w.waiting,
        policy=policy,
    )


def test_only_ready_replicas_of_the_model_are_ever_chosen():
    workers = [
        worker("warming", state=WorkerState.WARMING),
        worker("draining", state=WorkerState.DRAINING),
        worker("other-model", model="other"),
        worker("ready"),
    ]
    for policy in Policy:
        chosen = {pick(workers, f"k{i}", policy=policy).worker.worker_id for i in range(200)}
        assert chosen == {"ready"}
    assert pick(workers[:3], "k") is None


def test_versions_without_traffic_weight_get_no_requests():
    workers = [worker("a", version="v1"), worker("b", version="v2"), worker("c", version="v3")]
    snap = snapshot(("v1", 100), ("v2", 0))
    chosen = {pick(workers, f"k{i}", snap).worker.worker_id for i in range(300)}
    # v2 is a warm standby, v3 is not deployed at all.
    assert chosen == {"a"}


def test_traffic_weights_split_keys_and_a_key_keeps_its_version():
    workers = [worker("a", version="v1"), worker("b", version="v2")]
    snap = snapshot(("v1", 75), ("v2", 25))
    versions = [pick(workers, f"k{i}", snap).version for i in range(4000)]
    assert 0.2 < versions.count("v2") / len(versions) < 0.3
    assert all(pick(workers, f"k{i}", snap).version == versions[i] for i in range(100))


def test_the_warm_standby_serves_when_no_weighted_version_is_ready():
    workers = [worker("a", version="v1")]
    assert pick(workers, "k", snapshot(("v1", 0), ("v2", 100))).worker.worker_id == "a"


def test_affinity_holds_while_the_owner_has_room_then_the_least_loaded_successor_wins():
    workers = [worker(f"w{i}") for i in range(4)]
    first = pick(workers, "conversation-1", snapshot(max_queue=4))
    assert first.affinity and first.worker.worker_id == first.owner
    assert all(pick(workers, "conversation-1").worker.worker_id == first.owner for _ in range(5))

    busy = [
        worker(w.worker_id, running=10 if w.worker_id == first.owner else i)
        for i, w in enumerate(workers)
    ]
    fallback = pick(busy, "conversation-1", snapshot(max_queue=4, successors=3))
    assert not fallback.affinity and fallback.owner == first.owner
    assert fallback.worker.worker_id != first.owner
    # The fallback is the least loaded of the next ring successors.
    from fleet.router import ring_for

    ring_order = ring_for(frozenset(w.worker_id for w in busy), 64).successors("conversation-1", 4)
    assert ring_order[0] == first.owner
    by_id = {w.worker_id: w for w in busy}
    assert fallback.worker.worker_id == min(ring_order[1:], key=lambda c: load(by_id[c]))

    full_kv = [worker(w.worker_id, kv=90 if w.worker_id == first.owner else 0) for w in workers]
    assert not pick(full_kv, "conversation-1", snapshot(max_kv_usage=0.85)).affinity
    assert pick(busy, "conversation-1", policy=Policy.AFFINITY_ONLY).worker.worker_id == (
        first.owner
    )


def test_round_robin_cycles_through_the_pool():
    workers = [worker(f"w{i}") for i in range(3)]
    chosen = [pick(workers, "same", policy=Policy.ROUND_ROBIN).worker.worker_id for _ in range(6)]
    assert set(chosen[:3]) == {"w0", "w1", "w2"} and chosen[:3] == chosen[3:]


def test_without_deployments_every_ready_version_is_one_pool():
    workers = [worker("a", version="v1"), worker("b", version="")]
    assert {w.worker_id for w in version_pools(workers, MODEL, None)[0][2]} == {"a", "b"}


def test_a_key_sent_away_returns_to_the_same_successor_while_it_has_room():
    workers = [worker(f"w{i}") for i in range(4)]
    owner = pick(workers, "conversation-7").owner
    busy = [worker(w.worker_id, running=10 if w.worker_id == owner else 0) for w in workers]
    snap = snapshot(max_queue=4, successors=3)
    first = pick(busy, "conversation-7", snap).worker.worker_id
    # The first fallback's replica becomes loaded, but still has room.
    loaded = [worker(w.worker_id, running=3 if w.worker_id == first else w.running) for w in busy]
    assert pick(loaded, "conversation-7", snap).worker.worker_id == first
    full = [worker(w.worker_id, running=9 if w.worker_id == first else w.running) for w in busy]
    assert pick(full, "conversation-7", snap).worker.worker_id not in {first, owner}
