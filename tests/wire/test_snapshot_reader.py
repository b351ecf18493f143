"""The snapshot reader without Django: last valid copy, refusals counted, no going back."""

from __future__ import annotations

import json
import time
import uuid

from wire.snapshot import MemorySnapshotStore, SnapshotReader, snapshot_write


def _document(version: int, weight: float = 0.5) -> dict:
    return {
        "version": version,
        "published_at": time.time(),
        "routing": {
            "max_kv_usage": 0.85,
            "max_queue": 8,
            "successors": 3,
            "virtual_nodes": 64,
            "target_tokens_per_replica": 8192,
            "max_queue_age_seconds": 2.0,
            "warm_reserve": 0,
        },
        "tiers": {
            "pro": {
                "name": "pro",
                "display_name": "Pro",
                "rpm": 60,
                "tpm": 1000,
                "monthly_token_quota": 10,
                "max_context_tokens": 4096,
                "max_output_tokens": 512,
                "max_concurrent_requests": 4,
                "scheduling_weight": weight,
                "priority": 1,
                "queue_sla_seconds": 5,
                "api_access": True,
            }
        },
        "models": {},
        "deployments": [],
        "rollouts": [],
    }


def _reader() -> tuple[MemorySnapshotStore, SnapshotReader]:
    store = MemorySnapshotStore(f"test-{uuid.uuid4().hex}")
    return store, SnapshotReader(lambda: store, refresh=lambda: 0.0)


def test_the_reader_follows_newer_versions_and_exposes_tier_weights():
    store, reader = _reader()
    assert reader.current() is None
    assert snapshot_write(store, _document(1, weight=0.5))
    assert reader.current().tier_weights() == {"pro": 0.5}
    assert snapshot_write(store, _document(2, weight=0.25))
    assert reader.current().version == 2
    assert reader.current().tier_weights() == {"pro": 0.25}


def test_an_older_version_is_not_stored_and_an_invalid_one_is_refused():
    store, reader = _reader()
    snapshot_write(store, _document(5))
    assert not snapshot_write(store, _document(4))
    assert reader.current().version == 5
    broken = _document(6)
    broken["routing"]["max_queue"] = "many"
    store.store_raw(6, json.dumps(broken))
    assert reader.current().version == 5
    assert reader.status()["rejected"] == 1
    assert "routing.max_queue" in reader.status()["last_error"]


def test_version_numbers_rise_even_when_nothing_was_stored():
    store, _ = _reader()
    first = store.next_version()
    assert store.next_version() == first + 1
