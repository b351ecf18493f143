"""Worker metrics for Prometheus, under vLLM's names, labels and buckets.

Dashboards and alerts written for vLLM work unchanged: the metric names
are vLLM's (prometheus-client adds ``_total`` to counters, as in vLLM's own
exposition), every series carries vLLM's ``model_name`` and ``engine``
labels, and the histograms use vLLM's buckets (``vllm/v1/metrics/loggers.py``,
kept in ``wire.buckets``). Numbers vLLM has no name for carry our ``llmp_``
prefix. vLLM's core series here: requests running and waiting, KV usage,
prefix-cache queries and hits, preemptions, prompt and generation tokens,
request success by finish reason, TTFT, inter-token latency, per-request
time per output token, e2e / queue / prefill / decode / inference time,
per-request prompt and generation tokens, tokens per engine step,
speculative decoding (drafts, draft tokens, accepted tokens, accepted per
position) and ``vllm:cache_config_info``. Not here: vLLM's LoRA info, its
deprecated ``gpu_*`` aliases and the request-parameter histograms
(``n``, ``max_tokens``).

They live in the process's default registry: a ``gpuworker`` serves them
on its metrics port (``gpuworkers.probes``); the embedded worker's appear
in the web's ``/metrics``.

What it costs the engine thread: engine-wide numbers are read from the
``engine.stats()`` snapshot the loop takes for its heartbeat anyway (at
most every 0.1 s); per-request timings are observed where the tracker
builds a response's events (at most one observation per request per step,
never one per token); the iteration histogram takes one observation per
engine step.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from wire.buckets import (
    ITERATION_TOKEN_BUCKETS,
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    buckets_1_2_5,
)

LABELS = ("model_name", "engine")

# -- vLLM's names ---------------------------------------------------------------
RUNNING = Gauge(
    "vllm:num_requests_running", "Number of requests in model execution batches.", LABELS
)
WAITING = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", LABELS)
KV_USAGE = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", LABELS)
PREFIX_QUERIES = Counter(
    "vllm:prefix_cache_queries",
    "Prefix cache queries, in terms of number of queried tokens.",
    LABELS,
)
PREFIX_HITS = Counter(
    "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", LABELS
)
PREEMPTIONS = Counter(
    "vllm:num_preemptions", "Cumulative number of preemption from the engine.", LABELS
)
PROMPT_TOKENS = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS)
GENERATION_TOKENS = Counter(
    "vllm:generation_tokens", "Number of generation tokens processed.", LABELS
)
REQUEST_SUCCESS = Counter(
    "vllm:request_success",
    "Count of successfully processed requests.",
    (*LABELS, "finished_reason"),
)
TTFT = Histogram(
    "vllm:time_to_first_token_seconds",
    "Histogram of time to first token in seconds.",
    LABELS,
    buckets=TTFT_BUCKETS,
)
ITL = Histogram(
    "vllm:inter_token_latency_seconds",
    "Histogram of inter-token latency in seconds.",
    LABELS,
    buckets=ITL_BUCKETS,
)
E2E = Histogram(
    "vllm:e2e_request_latency_seconds",
    "Histogram of e2e request latency in seconds.",
    LABELS,
    buckets=REQUEST_LATENCY_BUCKETS,
)
QUEUE_TIME = Histogram(
    "vllm:request_queue_time_seconds",
    "Histogram of time spent in WAITING phase for request.",
    LABELS,
    buckets=REQUEST_LATENCY_BUCKETS,
)

REQUEST_TPOT = Histogram(
    # vLLM's per-request mean; its older vllm:time_per_output_token_seconds
    # is the per-step series now named vllm:inter_token_latency_seconds.
    "vllm:request_time_per_output_token_seconds",
    "Histogram of time_per_output_token_seconds per request.",
    LABELS,
    buckets=ITL_BUCKETS,
)
PREFILL_TIME = Histogram(
    "vllm:request_prefill_time_seconds",
    "Histogram of time spent in PREFILL phase for request.",
    LABELS,
    buckets=REQUEST_LATENCY_BUCKETS,
)
DECODE_TIME = Histogram(
    "vllm:request_decode_time_seconds",
    "Histogram of time spent in DECODE phase for request.",
    LABELS,
    buckets=REQUEST_LATENCY_BUCKETS,
)
INFERENCE_TIME = Histogram(
    "vllm:request_inference_time_seconds",
    "Histogram of time spent in RUNNING phase for request.",
    LABELS,
    buckets=REQUEST_LATENCY_BUCKETS,
)
ITERATION_TOKENS = Histogram(
    "vllm:iteration_tokens_total",
    "Histogram of number of tokens per engine_step.",
    LABELS,
    buckets=ITERATION_TOKEN_BUCKETS,
)
SPEC_DRAFTS = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", LABELS)
SPEC_DRAFT_TOKENS = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", LABELS)
SPEC_ACCEPTED_TOKENS = Counter(
    "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", LABELS
)
SPEC_ACCEPTED_PER_POS = Counter(
    "vllm:spec_decode_num_accepted_tokens_per_pos",
    "Accepted tokens per draft position.",
    (*LABELS, "position"),
)
# vLLM's labels are its CacheConfig's fields; these are the ones our engine has.
CACHE_CONFIG_LABELS = (
    "block_size",
    "cache_dtype",
    "enable_prefix_caching",
    "num_gpu_blocks",
    "num_cpu_blocks",
)
CACHE_CONFIG_INFO = Gauge(
    "vllm:cache_config_info",
    "Information of the LLMEngine CacheConfig",
    (*LABELS, *CACHE_CONFIG_LABELS),
)
# The cache configuration each (model_name, engine) pair last published: a
# new engine in the same process (a restarted loop, a reconfigured pool)
# replaces its series instead of leaving two info series for one engine.
_CACHE_CONFIG_PUBLISHED: dict[tuple[str, ...], tuple[str, ...]] = {}
# The per-request token-count histograms' buckets depend on the served
# model's context length (vLLM: 1, 2, 5, ... up to max_model_len). A
# process registers a metric name once, so the first engine's length
# fixes them; a gpuworker serves one model, and so does the embedded one.
_TOKEN_HISTOGRAMS: dict[str, Histogram] = {}
DEFAULT_MAX_MODEL_LEN = 8192


def _token_histograms(max_model_len: int) -> dict[str, Histogram]:
    if not _TOKEN_HISTOGRAMS:
        buckets = buckets_1_2_5(max_model_len)
        _TOKEN_HISTOGRAMS["prompt"] = Histogram(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            LABELS,
            buckets=buckets,
        )
        _TOKEN_HISTOGRAMS["generation"] = Histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            LABELS,
            buckets=buckets,
        )
    return _TOKEN_HISTOGRAMS


# -- ours -------------------------------------------------------------------------
SWAPPED = Gauge(
    "llmp_worker_requests_swapped", "Sequences swapped out to the host KV pool.", LABELS
)
SWAPS = Counter(
    "llmp_worker_swaps",
    "Sequences swapped between the device and host KV pools, by direction (out, in).",
    (*LABELS, "direction"),
)
RECOMPUTES = Counter(
    "llmp_worker_recomputes",
    "Preempted sequences dropped and recomputed (host pool full).",
    LABELS,
)
TIER_WEIGHT = Gauge(
    "llmp_worker_tier_weight", "Fair-share weight of each tier on this worker.", (*LABELS, "tier")
)
TIER_SHARE = Gauge(
    "llmp_worker_tier_share",
    "Each tier's share of this worker's in-flight responses.",
    (*LABELS, "tier"),
)
TIER_QUEUED = Gauge(
    "llmp_worker_tier_queued_requests",
    "Sequences waiting or swapped out, per tier.",
    (*LABELS, "tier"),
)
REFUSALS = Counter(
    "llmp_worker_admission_refusals",
    "Requests the worker refused at intake, by reason (draining, invalid).",
    (*LABELS, "reason"),
)

# engine.stats() counters -> (metric, extra labels) they feed.
_STAT_COUNTERS = {
    "preemptions": (PREEMPTIONS, ()),
    "swaps_out": (SWAPS, ("out",)),
    "swaps_in": (SWAPS, ("in",)),
    "recomputes": (RECOMPUTES, ()),
    "generated_tokens": (GENERATION_TOKENS, ()),
    # Speculative decoding (engine/spec/): a verification is vLLM's "draft".
    "spec_verifications": (SPEC_DRAFTS, ()),
    "spec_draft_tokens": (SPEC_DRAFT_TOKENS, ()),
    "spec_accepted_tokens": (SPEC_ACCEPTED_TOKENS, ()),
}


@dataclass(slots=True)
class RequestPhases:
    """A finished request's phases in seconds, as vLLM splits them.

    Queued until first scheduled, then prefill (to the first token), then
    decode (first to last token); inference is prefill plus decode. None
    where the request never reached that phase (aborted while queued).
    """

    prefill: float | None
    decode: float | None
    inference: float | None
    prompt_tokens: int
    generation_tokens: int


class WorkerMetrics:
    """One serving engine's series (its ``model_name`` and ``engine`` labels).

    ``max_model_len`` sets the per-request token histograms' buckets (the
    first engine of the process fixes them).
    """

    def __init__(
        self, model_name: str, engine: str = "0", max_model_len: int = DEFAULT_MAX_MODEL_LEN
    ):
        self.labels = (model_name, engine)
        labels = self.labels
        tokens = _token_histograms(max_model_len)
        self.request_prompt_tokens = tokens["prompt"].labels(*labels)
        self.request_generation_tokens = tokens["generation"].labels(*labels)
        self.tpot, self.iteration_tokens = (
            REQUEST_TPOT.labels(*labels),
            ITERATION_TOKENS.labels(*labels),
        )
        self.prefill_time, self.decode_time = (
            PREFILL_TIME.labels(*labels),
            DECODE_TIME.labels(*labels),
        )
        self.inference_time = INFERENCE_TIME.labels(*labels)
        self.running, self.waiting = RUNNING.labels(*labels), WAITING.labels(*labels)
        self.kv_usage, self.swapped = KV_USAGE.labels(*labels), SWAPPED.labels(*labels)
        self.prefix_queries, self.prefix_hits = (
            PREFIX_QUERIES.labels(*labels),
            PREFIX_HITS.labels(*labels),
        )
        self.prompt_tokens = PROMPT_TOKENS.labels(*labels)
        self.ttft, self.itl = TTFT.labels(*labels), ITL.labels(*labels)
        self.e2e, self.queue_time = E2E.labels(*labels), QUEUE_TIME.labels(*labels)
        self._counters = {
            key: metric.labels(*labels, *extra) for key, (metric, extra) in _STAT_COUNTERS.items()
        }
        # Last engine counters seen; None until the baseline is taken.
        self._last: dict[str, int] | None = None
        self._tiers: set[str] = set()

    # -- engine-wide, from the heartbeat's stats snapshot ------------------------

    def restart_counting(self) -> None:
        """The next ``observe_stats`` takes a new baseline (after warm-up)."""
        self._last = None

    def observe_stats(self, stats: dict[str, Any], active: Iterable[Any] = ()) -> None:
        """Gauges from ``engine.stats()``; counters from its growth since last time.

        ``active`` are the tracker's in-flight responses (tier shares).
        """
        self.running.set(stats.get("running", 0))
        self.waiting.set(stats.get("waiting", 0))
        self.swapped.set(stats.get("swapped", 0))
        total = stats.get("kv_blocks_total", 0)
        self.kv_usage.set(stats.get("kv_blocks_used", 0) / total if total else 0.0)
        current = {key: int(stats.get(key, 0)) for key in _STAT_COUNTERS}
        # Accepted drafts by position (0: the first draft token).
        for position, accepted in enumerate(stats.get("spec_accepted_per_pos") or ()):
            key = f"spec_accepted_pos_{position}"
            current[key] = int(accepted)
            if key not in self._counters:
                self._counters[key] = SPEC_ACCEPTED_PER_POS.labels(*self.labels, str(position))
        if self._last is not None:
            for key, value in current.items():
                before = self._last.get(key, value)
                # A counter that went down was reset (warm-up zeroes some).
                grown = value - before if value >= before else value
                if grown:
                    self._counters[key].inc(grown)
        self._last = current
        self._observe_tiers(stats, active)

    def _observe_tiers(self, stats: dict[str, Any], active: Iterable[Any]) -> None:
        in_flight = Tally(r.request.tier for r in active)
        queued = stats.get("queued_by_tier") or {}
        weights = stats.get("tier_weights") or {}
        tiers = self._tiers | in_flight.keys() | queued.keys() | weights.keys()
        self._tiers = set(tiers)
        total = sum(in_flight.values())
        for tier in tiers:
            TIER_SHARE.labels(*self.labels, tier).set(in_flight[tier] / total if total else 0.0)
            TIER_QUEUED.labels(*self.labels, tier).set((queued.get(tier) or {}).get("requests", 0))
            if tier in weights:
                TIER_WEIGHT.labels(*self.labels, tier).set(weights[tier])

    def cache_config(self, info: Mapping[str, Any]) -> None:
        """``vllm:cache_config_info``: the KV cache's configuration as labels, value 1."""
        values = tuple(str(info[name]) for name in CACHE_CONFIG_LABELS)
        previous = _CACHE_CONFIG_PUBLISHED.get(self.labels)
        if previous is not None and previous != values:
            CACHE_CONFIG_INFO.remove(*self.labels, *previous)
        _CACHE_CONFIG_PUBLISHED[self.labels] = values
        CACHE_CONFIG_INFO.labels(*self.labels, *values).set(1)

    def iteration(self, tokens: int) -> None:
        """One engine step's prompt plus generated tokens (steps that ran a batch)."""
        if tokens > 0:
            self.iteration_tokens.observe(tokens)

    # -- per request, from the tracker --------------------------------------------

    def first_token(self, *, ttft: float, prompt_tokens: int, cached_tokens: int) -> None:
        """A response's first token: TTFT, and its prompt's prefix-cache lookup."""
        self.ttft.observe(max(ttft, 0.0))
        self.prompt_tokens.inc(prompt_tokens)
        self.prefix_queries.inc(prompt_tokens)
        self.prefix_hits.inc(cached_tokens)

    def next_tokens(self, seconds: float) -> None:
        """Time since the response's previous tokens (one observation per step)."""
        self.itl.observe(max(seconds, 0.0))

    def finished(
        self, *, reason: str, e2e: float, queue: float | None, phases: RequestPhases
    ) -> None:
        """A response the engine ended (stop, length or abort)."""
        REQUEST_SUCCESS.labels(*self.labels, reason).inc()
        self.e2e.observe(max(e2e, 0.0))
        if queue is not None:
            self.queue_time.observe(max(queue, 0.0))
        for histogram, seconds in (
            (self.prefill_time, phases.prefill),
            (self.decode_time, phases.decode),
            (self.inference_time, phases.inference),
        ):
            if seconds is not None:
                histogram.observe(max(seconds, 0.0))
        # vLLM's per-request TPOT: decode time over the tokens after the first.
        if phases.decode is not None and phases.generation_tokens > 1:
            self.tpot.observe(max(phases.decode, 0.0) / (phases.generation_tokens - 1))
        self.request_prompt_tokens.observe(phases.prompt_tokens)
        self.request_generation_tokens.observe(phases.generation_tokens)

    def refused(self, reason: str) -> None:
        REFUSALS.labels(*self.labels, reason).inc()
