"""bench.fairness scenarios: the TTFT breakdown, the worker's span log and the vLLM side."""

from __future__ import annotations

import json

from bench.fairness_scenarios import (
    Outcome,
    breakdown,
    tenant_names,
    vllm_kv_blocks,
    vllm_priority_fields,
    worker_spans,
)


def _outcome(response_id: str, sent: float, ttft_ms: float) -> Outcome:
    return Outcome(
        "light",
        "auto",
        started=0.0,
        ttft_ms=ttft_ms,
        status=200,
        response_id=response_id,
        sent_wall=sent,
        first_wall=sent + ttft_ms / 1000,
    )


def test_breakdown_splits_each_requests_ttft_into_its_stages():
    # Idle: 100 ms = 20 admission + 10 queue + 60 prefill + 10 relay.
    # Flood: 400 ms = 20 + 310 + 60 + 10: the extra 300 ms is all queue.
    outcomes = [("idle", _outcome("a", 1000.0, 100.0)), ("flood", _outcome("b", 2000.0, 400.0))]
    entries = {
        "a": {"created_at": 1000.020, "queue_time_ms": 10, "ttft_ms": 70},
        "b": {"created_at": 2000.020, "queue_time_ms": 310, "ttft_ms": 370},
    }
    out = breakdown(outcomes, entries)
    assert out["unmatched"] == 0
    idle, flood = out["idle"]["rows"][0], out["flood"]["rows"][0]
    assert idle["web_admission_ms"] == 20.0 and flood["web_admission_ms"] == 20.0
    assert (idle["intake_and_engine_queue_ms"], flood["intake_and_engine_queue_ms"]) == (10, 310)
    assert idle["prefill_ms"] == flood["prefill_ms"] == 60
    assert idle["relay_ms"] == flood["relay_ms"] == 10.0
    assert out["extra_mean_ms"] == 300.0
    assert out["extra_share_by_stage"]["intake_and_engine_queue_ms"] == 1.0
    assert out["extra_share_by_stage"]["prefill_ms"] == 0.0


def test_breakdown_counts_requests_without_a_usage_entry():
    out = breakdown([("flood", _outcome("missing", 1.0, 50.0))], {})
    assert out["unmatched"] == 1
    assert out["flood"]["requests"] == 0
    assert "extra_mean_ms" not in out


def test_worker_spans_split_the_bus_wait_from_the_engine_queue(tmp_path):
    root = {
        "name": "gpuworker.request",
        "context": {"span_id": "0xroot"},
        "parent_id": "0xweb",
        "attributes": {"response_id": "chatcmpl-1", "messaging.wait_seconds": 0.25},
    }
    queued = {
        "name": "engine.queued",
        "context": {"span_id": "0xq"},
        "parent_id": "0xroot",
        "start_time": "2026-12-03T19:00:00.000000Z",
        "end_time": "2026-12-03T19:00:00.015000Z",
        "attributes": {},
    }
    log = tmp_path / "gpuworker.log"
    log.write_text(
        "worker ready\n" + json.dumps(root, indent=4) + "\n" + json.dumps(queued, indent=4) + "\n"
    )
    assert worker_spans(log) == {"chatcmpl-1": {"bus_wait_ms": 250.0, "engine_queued_ms": 15.0}}


def test_vllm_side_gives_the_light_tenant_the_better_priority():
    # vLLM: lower is earlier; the flooders keep its default 0.
    assert vllm_priority_fields("light", "auto") == {"priority": -1}
    assert vllm_priority_fields("flood2", "auto") == {"priority": 0}
    assert tenant_names("within-tier", 3) == ["flood1", "flood2", "flood3", "light"]


def test_vllm_gets_our_kv_pool_in_its_blocks():
    # smollm2-135m: 30 layers x K,V x 3 KV heads x 64 dims x 2 bytes = 23,040
    # bytes a token; 32 MiB hold 1,456 tokens: 45 blocks of 32.
    assert vllm_kv_blocks(32, 32) == 45
    assert vllm_kv_blocks(32, 16) == 91
