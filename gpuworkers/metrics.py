"""Worker metrics for Prometheus, under vLLM's names, labels and buckets.

Dashboards and alerts written for vLLM work unchanged: the metric names
are vLLM's (prometheus-client adds ``_total`` to counters, as in vLLM's own
exposition), every series carries vLLM's ``model_name`` and ``engine``
labels, and the histograms use vLLM's buckets (``vllm/v1/metrics/loggers.py``).
Numbers vLLM has no name for carry our ``llmp_`` prefix.

They live in the process's default registry: a ``gpuworker`` serves them
on its metrics port (``gpuworkers.probes``); the embedded worker's appear
in the web's ``/metrics``.

What it costs the engine thread: engine-wide numbers are read from the
``engine.stats()`` snapshot the loop takes for its heartbeat anyway (at
most every 0.1 s); per-request timings are observed where the tracker
builds a response's events (at most one observation per request per step,
never one per token).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

LABELS = ("model_name", "engine")

# vLLM's buckets, so histogram_quantile gives the same answer on both.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

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
# Speculative decoding's acceptance goes here under llmp_ once the engine has it.

# engine.stats() counters -> (metric, extra labels) they feed.
_STAT_COUNTERS = {
    "preemptions": (PREEMPTIONS, ()),
    "swaps_out": (SWAPS, ("out",)),
    "swaps_in": (SWAPS, ("in",)),
    "recomputes": (RECOMPUTES, ()),
    "generated_tokens": (GENERATION_TOKENS, ()),
}


class WorkerMetrics:
    """One serving engine's series (its ``model_name`` and ``engine`` labels)."""

    def __init__(self, model_name: str, engine: str = "0"):
        self.labels = (model_name, engine)
        labels = self.labels
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
        if self._last is not None:
            for key, value in current.items():
                before = self._last[key]
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

    def finished(self, *, reason: str, e2e: float, queue: float | None) -> None:
        """A response the engine ended (stop, length or abort)."""
        REQUEST_SUCCESS.labels(*self.labels, reason).inc()
        self.e2e.observe(max(e2e, 0.0))
        if queue is not None:
            self.queue_time.observe(max(queue, 0.0))

    def refused(self, reason: str) -> None:
        REFUSALS.labels(*self.labels, reason).inc()
