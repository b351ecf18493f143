"""Worker metrics under vLLM's names, read from a serving worker's metrics port."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuworkers.metrics import WorkerMetrics
from gpuworkers.probes import ProbeServer, loop_status
from inference.relay.dispatch import dispatch_request, stream_events
from tests.helpers import wait_until
from tests.plugins.engine import MODEL
from tests.wire.bus.buses import make_buses, uid
from wire.events import Event
from wire.requests import GenerationRequest
from wire.sampling import Sampling

# Item 1 of the issue, as a vLLM exposition shows them (counters with _total).
VLLM_SAMPLES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket",
    # Issue 32: vLLM's remaining core series.
    "vllm:request_time_per_output_token_seconds_bucket",
    "vllm:request_prefill_time_seconds_bucket",
    "vllm:request_decode_time_seconds_bucket",
    "vllm:request_inference_time_seconds_bucket",
    "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket",
    "vllm:iteration_tokens_total_bucket",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "vllm:cache_config_info",
)


@pytest.fixture(autouse=True)
def no_embedded_engine(settings):
    settings.EMBEDDED_ENGINE = False


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _samples(text: str, model: str) -> dict[str, float]:
    """Sample name (+ le / label suffix) -> value, for one model's series."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model_name") != model:
                continue
            assert sample.labels.get("engine") == "0", sample
            extra = {k: v for k, v in sample.labels.items() if k not in ("model_name", "engine")}
            key = sample.name + "".join(f"[{k}={v}]" for k, v in sorted(extra.items()))
            out[key] = sample.value
    return out


async def _run(bus, request: GenerationRequest) -> list[Event]:
    worker = await dispatch_request(request, bus=bus)
    return [
        e async for e in stream_events(request.response_id, worker_id=worker.worker_id, bus=bus)
    ]


@pytest.mark.asyncio
async def test_a_serving_worker_exposes_vllm_metrics_that_count_its_requests(serve, prompt_ids):
    """Every item-1 name is on the port with vLLM's labels, and two requests move them.

    The second request repeats the first's prompt, so it hits the prefix
    cache; TTFT, e2e and queue time get one observation per request, the
    inter-token latency one per step that gave tokens after the first.
    """
    bus, worker_bus = make_buses("memory")
    loop = serve(worker_bus)
    probes = ProbeServer(lambda: loop_status(loop), host="127.0.0.1", port=0).start()
    base = f"http://127.0.0.1:{probes.port}"
    try:
        status, text = _get(f"{base}/metrics")
        assert status == 200
        before = _samples(text, MODEL)
        assert set(VLLM_SAMPLES) <= {k.split("[")[0] for k in before}, sorted(before)

        prompt = prompt_ids("Explain in one sentence why the sky is blue, please.")
        sampling = Sampling(max_tokens=6, temperature=0.0, ignore_eos=True)
        terminals, token_deltas = [], 0
        for _ in range(2):
            request = GenerationRequest(
                response_id=uid("resp"), model=MODEL, prompt_token_ids=prompt, sampling=sampling
            )
            events = await _run(bus, request)
            terminals.append(events[-1])
            # One delta per step that gave the response tokens (several
            # tokens when speculative decoding accepted drafts).
            token_deltas += sum(
                1 for e in events if e.type == "delta" and any(c.token_ids for c in e.choices)
            )
        assert [t.type for t in terminals] == ["completed", "completed"]
        generated = sum(t.usage.completion_tokens for t in terminals)

        def grown() -> dict[str, float] | None:
            after = _samples(_get(f"{base}/metrics")[1], MODEL)
            delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
            # Engine-wide counters follow the heartbeat's stats snapshot.
            return delta if delta["vllm:generation_tokens_total"] >= generated else None

        delta = wait_until(grown, timeout=10, message="generation tokens counted")
    finally:
        probes.stop()
        await bus.close()

    assert delta["vllm:generation_tokens_total"] == generated == 12
    for histogram in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        assert delta[f"vllm:{histogram}_seconds_count"] == 2
    # One inter-token observation per step after a response's first tokens.
    assert delta["vllm:inter_token_latency_seconds_count"] == token_deltas - 2
    assert delta["vllm:prompt_tokens_total"] == delta["vllm:prefix_cache_queries_total"]
    assert delta["vllm:prompt_tokens_total"] == 2 * len(prompt)
    cached = sum(t.usage.cached_tokens for t in terminals)
    assert delta["vllm:prefix_cache_hits_total"] == cached >= 16
    assert delta["vllm:request_success_total[finished_reason=length]"] == 2
    # The histogram holds the TTFT the usage record gets (ms, rounded).
    ttft = sum(t.metrics.ttft_ms for t in terminals) / 1000
    assert delta["vllm:time_to_first_token_seconds_sum"] == pytest.approx(ttft, abs=0.002)
    # Per request: its phases and token counts, one observation each.
    for histogram in ("prefill_time", "decode_time", "inference_time", "time_per_output_token"):
        assert delta[f"vllm:request_{histogram}_seconds_count"] == 2, histogram
    assert delta["vllm:request_prompt_tokens_sum"] == 2 * len(prompt)
    assert delta["vllm:request_generation_tokens_sum"] == generated
    assert delta["vllm:request_generation_tokens_count"] == 2
    # Each request's inference time is its prefill plus its decode time.
    assert delta["vllm:request_inference_time_seconds_sum"] == pytest.approx(
        delta["vllm:request_prefill_time_seconds_sum"]
        + delta["vllm:request_decode_time_seconds_sum"]
    )
    # Every token an engine step computed, once: prompts less their cached
    # prefix, and the generated tokens.
    assert delta["vllm:iteration_tokens_total_sum"] == 2 * len(prompt) - cached + generated
    (info,) = [k for k in before if k.startswith("vllm:cache_config_info")]
    assert "[block_size=16]" in info and "[enable_prefix_caching=True]" in info, info


@pytest.mark.asyncio
async def test_speculative_decoding_counters_follow_the_engine(serve, prompt_ids, engine):
    """A reply that repeats its prompt drafts by n-gram lookup: vLLM's
    spec-decode counters grow by what the engine verified and accepted."""
    bus, worker_bus = make_buses("memory")
    loop = serve(worker_bus)
    probes = ProbeServer(lambda: loop_status(loop), host="127.0.0.1", port=0).start()
    url = f"http://127.0.0.1:{probes.port}/metrics"
    try:
        before = _samples(_get(url)[1], MODEL)
        spec_before = engine.stats()
        words = "red green blue yellow " * 6
        prompt = prompt_ids(f"Repeat these words exactly, over and over: {words}")
        request = GenerationRequest(
            response_id=uid("resp"),
            model=MODEL,
            prompt_token_ids=prompt,
            sampling=Sampling(max_tokens=24, temperature=0.0, ignore_eos=True),
        )
        assert (await _run(bus, request))[-1].type == "completed"
        spec = {
            k: engine.stats()[k] - spec_before[k]
            for k in ("spec_verifications", "spec_draft_tokens", "spec_accepted_tokens")
        }

        def grown() -> dict[str, float] | None:
            after = _samples(_get(url)[1], MODEL)
            delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
            done = delta["vllm:spec_decode_num_drafts_total"] >= spec["spec_verifications"]
            return delta if done else None

        delta = wait_until(grown, timeout=10, message="spec-decode counters scraped")
    finally:
        probes.stop()
        await bus.close()
    assert spec["spec_verifications"] > 0, "the repeated words never drafted"
    assert delta["vllm:spec_decode_num_drafts_total"] == spec["spec_verifications"]
    assert delta["vllm:spec_decode_num_draft_tokens_total"] == spec["spec_draft_tokens"]
    assert delta["vllm:spec_decode_num_accepted_tokens_total"] == spec["spec_accepted_tokens"]
    per_pos = [
        delta.get(f"vllm:spec_decode_num_accepted_tokens_per_pos_total[position={i}]", 0.0)
        for i in range(engine.config.num_speculative_tokens)
    ]
    # Accepted tokens counted by position add up; a later position is
    # accepted only after every earlier one.
    assert sum(per_pos) == spec["spec_accepted_tokens"]
    assert per_pos == sorted(per_pos, reverse=True)


def test_engine_counters_count_growth_and_survive_a_reset():
    """Counters grow by the stats' deltas; a counter that went down restarted from 0."""
    metrics = WorkerMetrics(uid("model"))
    counter = metrics._counters["preemptions"]
    metrics.observe_stats({"preemptions": 5, "kv_blocks_used": 3, "kv_blocks_total": 4})
    assert counter._value.get() == 0  # the first snapshot is the baseline
    assert metrics.kv_usage._value.get() == 0.75
    metrics.observe_stats({"preemptions": 7})
    assert counter._value.get() == 2
    metrics.observe_stats({"preemptions": 1})  # the engine's counter restarted
    assert counter._value.get() == 3
    metrics.restart_counting()
    metrics.observe_stats({"preemptions": 40})
    assert counter._value.get() == 3


def test_tier_shares_are_the_in_flight_responses_per_tier():
    class Response:
        def __init__(self, tier: str):
            self.request = GenerationRequest("r", "m", [1], {}, tier=tier)

    metrics = WorkerMetrics(uid("model"))
    stats = {
        "tier_weights": {"pro": 0.35, "free": 0.15},
        "queued_by_tier": {"free": {"requests": 2}},
    }
    metrics.observe_stats(stats, [Response("pro"), Response("pro"), Response("free")])
    from gpuworkers.metrics import TIER_QUEUED, TIER_SHARE, TIER_WEIGHT

    share = {t: TIER_SHARE.labels(*metrics.labels, t)._value.get() for t in ("pro", "free")}
    assert share == pytest.approx({"pro": 2 / 3, "free": 1 / 3})
    assert TIER_QUEUED.labels(*metrics.labels, "free")._value.get() == 2
    assert TIER_WEIGHT.labels(*metrics.labels, "pro")._value.get() == 0.35
    metrics.observe_stats(stats, [])  # the tiers go idle: shares drop to 0, not stale
    assert TIER_SHARE.labels(*metrics.labels, "pro")._value.get() == 0.0


def test_a_new_engine_replaces_its_cache_config_series():
    """One info series per (model, engine): a second loop in the same process
    (another pool size) replaces the first's series instead of adding one."""
    from prometheus_client import generate_latest

    model = uid("model")
    config = {
        "block_size": 16,
        "cache_dtype": "float32",
        "enable_prefix_caching": True,
        "num_gpu_blocks": 45,
        "num_cpu_blocks": 0,
    }
    WorkerMetrics(model).cache_config(config)
    WorkerMetrics(model).cache_config({**config, "num_gpu_blocks": 91})
    samples = _samples(generate_latest().decode(), model)
    (info,) = [k for k in samples if k.startswith("vllm:cache_config_info")]
    assert "[num_gpu_blocks=91]" in info, info
